"""Bandwidth classes on orders, bids and pool orders: guaranteed, standard (the default) or
scavenger, checked before anything is written (issue 25, item 3)."""

import pytest

from billing.models import Hold
from market.models import Order
from tests.factories import client_for
from tests.market.test_auctions import funded_tenant, market_with_32_gpus_at

H100 = "H100-80GB"


def order(**extra):
    return {"gpu_models": [H100], "gpus": 8, "hours": 2, "max_price_per_gpu_hour": "4.00",
            "tier": "spot", "fill": "rest", **extra}


@pytest.fixture
def client(db):
    market_with_32_gpus_at()
    return client_for(funded_tenant("bw-ai"))


def test_an_order_without_a_class_is_standard(client):
    body = client.post("/api/v1/orders/", order(), format="json").json()
    assert body["bandwidth"] == {"class": "standard", "gbps_per_gpu": None}


def test_a_guaranteed_bid_keeps_its_class_and_gbps(client):
    response = client.post("/api/v1/orders/", order(
        bandwidth={"class": "guaranteed", "gbps_per_gpu": 50}), format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["bandwidth"] == {"class": "guaranteed", "gbps_per_gpu": 50.0}
    saved = Order.objects.get()
    assert (saved.bandwidth_class, str(saved.gbps_per_gpu)) == ("guaranteed", "50.0")


def test_a_scavenger_order_is_taken(client):
    body = client.post("/api/v1/orders/", order(bandwidth={"class": "scavenger"}),
                       format="json").json()
    assert body["bandwidth"]["class"] == "scavenger"


def refused_on(client, bandwidth, **extra):
    response = client.post("/api/v1/orders/", order(bandwidth=bandwidth, **extra), format="json")
    assert response.status_code == 400, response.json()
    assert not Order.objects.exists() and not Hold.objects.exists()
    return response.json()["error"]["fields"]


def test_an_unknown_class_is_refused_naming_the_field(client):
    fields = refused_on(client, {"class": "platinum"})
    assert fields["bandwidth.class"] == ['"platinum" is not a valid choice.']


def test_a_guarantee_above_the_fastest_link_is_refused(client):
    fields = refused_on(client, {"class": "guaranteed", "gbps_per_gpu": 5000})
    assert "bandwidth.gbps_per_gpu" in fields
    assert "above the fastest link" in fields["bandwidth.gbps_per_gpu"][0]


def test_a_guaranteed_class_without_gbps_is_refused(client):
    assert "bandwidth.gbps_per_gpu" in refused_on(client, {"class": "guaranteed"})


def test_gbps_with_a_class_that_guarantees_nothing_is_refused(client):
    assert "bandwidth.gbps_per_gpu" in refused_on(client, {"class": "standard",
                                                           "gbps_per_gpu": 10})


def test_an_unknown_field_in_bandwidth_is_refused(client):
    fields = refused_on(client, {"class": "standard", "priority": 3})
    assert fields == {"bandwidth.priority": ["Unknown field."]}


def test_parts_of_gpus_cannot_be_guaranteed(client):
    body = order(bandwidth={"class": "guaranteed", "gbps_per_gpu": 10}, tier="on_demand",
                 gpu_share=500, count=1)
    del body["gpus"], body["fill"]
    response = client.post("/api/v1/orders/", body, format="json")
    assert response.status_code == 400
    assert "bandwidth.class" in response.json()["error"]["fields"]


def test_the_lease_of_an_order_shows_its_class(client):
    response = client.post("/api/v1/orders/", order(tier="on_demand", fill="fill_or_kill",
                                                    bandwidth={"class": "scavenger"}),
                           format="json")
    assert response.json()["state"] == "filled", response.json()
    lease = client.get(f"/api/v1/leases/{response.json()['lease']}/").json()
    assert lease["bandwidth"] == {"class": "scavenger", "gbps_per_gpu": None}


def test_a_quote_refuses_an_unknown_class_like_an_order(client):
    response = client.post("/api/v1/quote/", order(tier="on_demand", fill="fill_or_kill",
                                                    bandwidth={"class": "gold"}), format="json")
    assert response.status_code == 400
    assert "bandwidth.class" in response.json()["error"]["fields"]

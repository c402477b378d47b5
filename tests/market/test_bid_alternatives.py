"""Auction bids over alternatives: 2 to 8 shapes, at most one of which wins."""

import pytest

from billing.models import Hold
from market.models import Order
from tests.factories import client_for
from tests.market.test_auctions import funded_tenant, market_with_32_gpus_at

H100 = "H100-80GB"


def shape(gpus=8, hours=2, limit="2.00", models=(H100,), **extra):
    return {"gpu_models": list(models), "gpus": gpus, "hours": hours,
            "max_price_per_gpu_hour": limit, **extra}


def post(client, **body):
    return client.post("/api/v1/orders/", {"tier": "spot", "fill": "rest", **body},
                       format="json")


@pytest.fixture
def client(db):
    market_with_32_gpus_at()
    return client_for(funded_tenant("alt-ai"))


def test_a_bid_over_alternatives_rests_with_its_shapes_and_holds_its_dearest(client):
    response = post(client, alternatives=[shape(8, 2, "2.00"),
                                          shape(16, 4, "1.50", topology={"required": "leaf"})])

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "resting" and body["alternative"] is None
    assert [a["gpus"] for a in body["alternatives"]] == [8, 16]
    assert body["alternatives"][1] == {"gpu_models": [H100], "gpus": 16, "hours": 4,
                                       "max_price_per_gpu_hour": "1.50",
                                       "topology": {"required": "leaf", "whole_nodes": False}}
    hold = Hold.objects.get(order_ref=f"order-{body['id']}")
    assert hold.amount_micros == 16 * 4 * 1_500_000  # 96.00 beats 8 x 2 x 2.00 = 32.00


def test_a_bid_of_one_shape_is_alternative_zero(client):
    body = post(client, **shape()).json()
    assert body["alternatives"] == [] and body["alternative"] == 0


@pytest.mark.parametrize("count", [1, 9])
def test_fewer_than_two_or_more_than_eight_alternatives_are_refused(client, count):
    response = post(client, alternatives=[shape()] * count)
    assert response.status_code == 400
    assert "alternatives" in response.json()["error"]["fields"]
    assert not Order.objects.exists()


def test_a_bid_giving_both_a_shape_and_alternatives_is_refused(client):
    response = post(client, gpus=8, alternatives=[shape(), shape(16)])
    assert response.status_code == 400
    assert "gpus" in response.json()["error"]["fields"]["alternatives"][0]
    assert not Order.objects.exists()


def test_an_alternative_naming_no_market_is_refused_with_its_position(client):
    response = post(client, alternatives=[shape(), shape(models=["Z9000"])])
    assert response.status_code == 400
    assert "alternatives.1.gpu_models" in response.json()["error"]["fields"]
    assert not Order.objects.exists()


def test_alternatives_are_for_auction_bids_only(client):
    response = client.post("/api/v1/orders/", {"tier": "on_demand",
                                               "alternatives": [shape(), shape(16)]},
                           format="json")
    assert response.status_code == 400 and "tier" in response.json()["error"]["fields"]


def test_an_order_without_alternatives_still_needs_its_shape(client):
    response = post(client, gpus=8)
    assert response.status_code == 400
    assert set(response.json()["error"]["fields"]) == {"gpu_models", "hours", "max_price_per_gpu_hour"}


def test_alternatives_are_not_for_a_private_pool(client):
    response = post(client, pool="lab-pool", alternatives=[shape(), shape(16)])
    assert response.status_code == 400 and "pool" in response.json()["error"]["fields"]
    assert not Order.objects.exists()

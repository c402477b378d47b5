"""`ibex order|bid --bandwidth guaranteed:50 | standard | scavenger`: the order's bandwidth
class, sent as `bandwidth`, a bad value refused before anything is sent, the class shown with
the order and the lease; and, against the real API, the order and its lease carry the class."""

import json
from decimal import Decimal

import pytest

from ibex.accounts import services as accounts
from ibex.accounts.models import Organization
from market.models import Order
from tests.client.samples import LEASE, ORDER, SLA
from tests.scheduler.moves.test_remediation import setup_market

ORDER_FLAGS = ("order", "--gpus", "16", "--model", "H100-80GB", "--hours", "2",
               "--max-price", "2.00")


def sent(stub):
    return stub.requests_to("/api/v1/orders/")[-1].body


@pytest.mark.parametrize(("flag", "body"), [
    ("guaranteed:50", {"class": "guaranteed", "gbps_per_gpu": "50"}),
    ("guaranteed:12.5", {"class": "guaranteed", "gbps_per_gpu": "12.5"}),
    ("standard", {"class": "standard"}),
    ("scavenger", {"class": "scavenger"}),
])
def test_the_class_goes_with_the_order_as_bandwidth(stub, ibex, flag, body):
    stub.answer("POST", "/api/v1/orders/", (201, {**ORDER, "bandwidth": {
        "class": body["class"], "gbps_per_gpu": 50.0 if "gbps_per_gpu" in body else None}}))

    code, out, err = ibex(*ORDER_FLAGS, "--bandwidth", flag)

    assert code == 0, err
    assert sent(stub)["bandwidth"] == body
    assert ("bandwidth guaranteed, 50 Gb/s per GPU" in out) == (body["class"] == "guaranteed")


def test_a_bid_takes_the_class_too(stub, ibex):
    stub.answer("POST", "/api/v1/orders/", (201, {**ORDER, "state": "resting", "lease": None,
                                                   "tier": "spot"}))

    code, _out, err = ibex("bid", "--gpus", "16", "--model", "H100-80GB", "--hours", "2",
                           "--max-price", "2.00", "--bandwidth", "scavenger")

    assert code == 0, err
    assert sent(stub)["bandwidth"] == {"class": "scavenger"}


def test_without_the_flag_no_class_is_sent_and_the_server_decides_standard(stub, ibex):
    stub.answer("POST", "/api/v1/orders/", (201, ORDER))

    code, _out, err = ibex(*ORDER_FLAGS)

    assert code == 0, err
    assert "bandwidth" not in sent(stub)


@pytest.mark.parametrize(("flag", "says"), [
    ("gold", "unknown class 'gold': use guaranteed:GBPS (Gb/s per GPU), standard or scavenger"),
    ("guaranteed", "guaranteed needs its Gb/s per GPU: guaranteed:50"),
    ("guaranteed:", "guaranteed needs its Gb/s per GPU: guaranteed:50"),
    ("guaranteed:fast", "guaranteed:fast: Gb/s per GPU is a number above 0"),
    ("guaranteed:0", "guaranteed:0: Gb/s per GPU is a number above 0"),
    ("standard:10", "only guaranteed takes Gb/s per GPU: give standard alone"),
])
def test_a_bad_class_is_refused_saying_why_and_nothing_is_sent(stub, ibex, flag, says):
    code, _out, err = ibex(*ORDER_FLAGS, "--bandwidth", flag)

    assert code == 2
    assert "--bandwidth" in err and says in err, err
    assert stub.requests_to("/api/v1/orders/") == []


def test_the_lease_shows_its_class(stub, ibex):
    stub.answer("GET", "/api/v1/leases/7/", (200, {
        **LEASE, "bandwidth": {"class": "guaranteed", "gbps_per_gpu": 50.0}}))
    stub.answer("GET", "/api/v1/leases/7/sla/", (200, SLA))

    code, out, err = ibex("lease", "7")

    assert code == 0, err
    assert "  bandwidth guaranteed, 50 Gb/s per GPU" in out.splitlines()


def test_the_lease_shows_its_partition_and_delivered_bandwidth(stub, ibex):
    stub.answer("GET", "/api/v1/leases/7/", (200, {
        **LEASE, "fabric": {"pkey": "0x1a2b", "delivered_gbps": {
            "last_interval": 29.816, "mean": 12.5, "sampled_at": "2026-12-04T03:00:00Z",
            "shared": False}}}))
    stub.answer("GET", "/api/v1/leases/7/sla/", (200, SLA))

    code, out, err = ibex("lease", "7")

    assert code == 0, err
    assert "  fabric    partition 0x1a2b, delivered 29.816 Gb/s (mean 12.5)" in out.splitlines()


@pytest.mark.django_db(transaction=True)
def test_against_the_real_api_the_order_and_its_lease_carry_the_class(
        live_server, monkeypatch, ibex):
    setup_market()  # a provider's nodes on fabric "lab", and a funded tenant
    key = accounts.issue_api_key(organization=Organization.objects.get(slug="acme-ai"),
                                 scopes=["read", "trade"]).raw_key
    monkeypatch.setenv("IBEX_API", live_server.url)
    monkeypatch.setenv("IBEX_API_KEY", key)

    # 5 Gb/s a GPU: 8 GPUs a node, 40 Gb/s a hop of its ring, within the links' 80 % share
    code, out, err = ibex(*ORDER_FLAGS[:-1], "3.00", "--within", "leaf",
                          "--bandwidth", "guaranteed:5", "--json")
    refused = ibex(*ORDER_FLAGS[:-1], "3.00", "--bandwidth", "guaranteed:100000")

    assert code == 0, err
    order = Order.objects.get()
    assert (order.bandwidth_class, order.gbps_per_gpu) == ("guaranteed", Decimal("5"))
    assert json.loads(out)["order"]["bandwidth"] == {"class": "guaranteed", "gbps_per_gpu": 5.0}
    # above the fastest link: the server's 400 names the field; no second order
    assert refused[0] == 1 and "bandwidth.gbps_per_gpu" in refused[2], refused
    assert Order.objects.count() == 1

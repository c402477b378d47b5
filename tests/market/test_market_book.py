"""`GET /api/v1/markets/{model}/book/`: the bids of the next clearing, summed per price and
required topology level, naming no bidder."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import services as money
from market import orders
from market.models import Clearing
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes

NOW = datetime(2026, 11, 18, 14, 20, 30, tzinfo=UTC)


def funded_tenant(slug):
    tenant = make_org(slug, "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


def bid(tenant, gpus, limit, *, hours=1, within=None, tier="spot", models=("H100-80GB",),
        topology=None, **extra):
    """A bid resting for the next clearing (spot, or reserved with a start window); `within`
    the level it requires."""
    if topology is None:
        topology = {"required": within} if within else {}
    return orders.place_order(tenant=tenant, actor=f"{tenant.slug}-trader",
                              request=orders.OrderRequest(
                                  gpu_models=list(models), gpus=gpus, hours=hours, tier=tier,
                                  max_price_micros=limit, fill="rest", topology=topology,
                                  **extra))


@pytest.fixture
def market(db, time_machine):
    """32 H100s (4 nodes, 2 leaves): bids must fit a fabric to be taken."""
    time_machine.move_to(NOW, tick=False)
    return provider_with_nodes(nodes=4)


@pytest.fixture
def bidders(market):
    return funded_tenant("acme-ai"), funded_tenant("rival-labs")


def test_it_sums_bids_per_price_and_required_topology_highest_price_first(api_client, bidders):
    acme, rival = bidders
    bid(acme, 16, 3_000_000, hours=4, within="leaf")
    bid(rival, 8, 3_000_000, hours=2, within="leaf")
    bid(rival, 8, 3_000_000, hours=1)
    bid(acme, 32, 2_500_000, hours=3, within="spine")
    bid(acme, 4, 2_500_000, hours=1, within="node")
    bid(rival, 2, 1_750_000, hours=10)

    response = api_client.get("/api/v1/markets/H100-80GB/book/")

    assert response.status_code == 200
    assert response.json()["levels"] == [
        {"price_per_gpu_hour": "3.00", "topology": "none", "bids": 1, "gpus": 8, "gpu_hours": 8},
        {"price_per_gpu_hour": "3.00", "topology": "leaf", "bids": 2, "gpus": 24,
         "gpu_hours": 80},
        {"price_per_gpu_hour": "2.50", "topology": "node", "bids": 1, "gpus": 4, "gpu_hours": 4},
        {"price_per_gpu_hour": "2.50", "topology": "spine", "bids": 1, "gpus": 32,
         "gpu_hours": 96},
        {"price_per_gpu_hour": "1.75", "topology": "none", "bids": 1, "gpus": 2,
         "gpu_hours": 20},
    ]


def test_a_preferred_topology_counts_as_none_required(api_client, bidders):
    acme, _ = bidders
    bid(acme, 8, 2_000_000, topology={"preferred": "leaf"})

    levels = api_client.get("/api/v1/markets/H100-80GB/book/").json()["levels"]

    assert [(level["topology"], level["gpus"]) for level in levels] == [("none", 8)]


def test_the_book_names_no_bidder(api_client, bidders):
    acme, rival = bidders
    placed = [bid(acme, 16, 3_000_000, within="leaf"), bid(rival, 8, 2_900_000)]

    response = api_client.get("/api/v1/markets/H100-80GB/book/")

    body = response.json()
    assert set(body) == {"gpu_model", "next_clearing", "levels"}
    for level in body["levels"]:
        assert set(level) == {"price_per_gpu_hour", "topology", "bids", "gpus", "gpu_hours"}
    text = response.content.decode().lower()
    for name in ("acme", "rival", "trader", "tenant", "order", "lease", "user", "id\""):
        assert name not in text
    assert {o.tenant.slug for o in placed} == {"acme-ai", "rival-labs"}


def test_it_keeps_out_what_the_next_clearing_does_not_take(api_client, bidders,
                                                          time_machine):
    acme, rival = bidders
    provider_with_nodes(slug="campus-gpus", nodes=1, gpu_model="A100-80GB", fabric="campus")
    kept = bid(acme, 8, 3_000_000)
    orders.cancel_order(order=bid(rival, 8, 4_000_000), actor="rival")
    bid(rival, 8, 5_000_000, models=("A100-80GB",))
    bid(rival, 8, 6_000_000, tier="reserved", start_earliest=NOW + timedelta(minutes=1),
        start_latest=NOW + timedelta(minutes=2))
    bid(rival, 8, 7_000_000, tier="reserved", start_earliest=NOW + timedelta(hours=2),
        start_latest=NOW + timedelta(hours=3))
    time_machine.move_to(NOW + timedelta(minutes=5), tick=False)  # the first window passed

    levels = api_client.get("/api/v1/markets/H100-80GB/book/").json()["levels"]

    assert [(level["price_per_gpu_hour"], level["gpus"]) for level in levels] == [
        ("7.00", 8), ("3.00", kept.gpus)]


def test_a_bid_for_two_models_is_in_both_books(api_client, bidders):
    acme, _ = bidders
    bid(acme, 8, 3_000_000, models=("H100-80GB", "H200-141GB"))

    for model in ("H100-80GB", "H200-141GB"):
        levels = api_client.get(f"/api/v1/markets/{model}/book/").json()["levels"]
        assert [level["gpus"] for level in levels] == [8]


def test_a_bid_over_alternatives_is_there_with_each_shape_naming_the_market(api_client,
                                                                           bidders):
    acme, rival = bidders
    provider_with_nodes(slug="nordic", nodes=2, gpu_model="H200-141GB", fabric="oslo")
    shapes = [{"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 2,
               "max_price_micros": 2_400_000, "topology": {"required": "leaf"}},
              {"gpu_models": ["H200-141GB"], "gpus": 16, "hours": 2,
               "max_price_micros": 2_900_000, "topology": {}},
              {"gpu_models": ["H100-80GB"], "gpus": 32, "hours": 1,
               "max_price_micros": 1_500_000, "topology": {"required": "spine"}}]
    bid(acme, 16, 2_400_000, hours=2, within="leaf", alternatives=shapes)
    bid(rival, 8, 2_400_000, hours=3, within="leaf")

    h100 = api_client.get("/api/v1/markets/H100-80GB/book/").json()["levels"]
    h200 = api_client.get("/api/v1/markets/H200-141GB/book/").json()["levels"]

    assert h100 == [
        {"price_per_gpu_hour": "2.40", "topology": "leaf", "bids": 2, "gpus": 24,
         "gpu_hours": 56},
        {"price_per_gpu_hour": "1.50", "topology": "spine", "bids": 1, "gpus": 32,
         "gpu_hours": 32}]
    assert h200 == [{"price_per_gpu_hour": "2.90", "topology": "none", "bids": 1, "gpus": 16,
                     "gpu_hours": 32}]


def test_the_next_clearing_is_this_interval_until_it_has_cleared(api_client, market, settings):
    settings.AUCTION_INTERVAL_S = 60
    this_interval = NOW.replace(second=0)

    before = api_client.get("/api/v1/markets/H100-80GB/book/").json()
    Clearing.objects.create(gpu_model="H100-80GB", interval_start=this_interval)
    after = api_client.get("/api/v1/markets/H100-80GB/book/").json()

    assert before["next_clearing"] == "2026-11-18T14:20:00Z"
    assert after["next_clearing"] == "2026-11-18T14:21:00Z"
    assert before["levels"] == after["levels"] == []


def test_the_book_as_csv_has_a_header_row_of_the_same_fields(api_client, bidders):
    acme, rival = bidders
    bid(acme, 16, 3_000_000, hours=4, within="leaf")
    bid(rival, 8, 2_000_000)

    response = api_client.get("/api/v1/markets/H100-80GB/book/?format=csv")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [["price_per_gpu_hour", "topology", "bids", "gpus", "gpu_hours"],
                    ["3.00", "leaf", "1", "16", "64"],
                    ["2.00", "none", "1", "8", "8"]]


def test_an_unknown_format_is_a_400_naming_format(api_client, market):
    response = api_client.get("/api/v1/markets/H100-80GB/book/?format=xml")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["format"]


def test_an_unknown_market_is_a_404(api_client, market):
    assert api_client.get("/api/v1/markets/Z9000/book/").status_code == 404
    assert api_client.get("/api/v1/markets/Z9000/book/?format=csv").status_code == 404


def test_the_book_takes_the_same_queries_for_many_bids(api_client, bidders):
    acme, rival = bidders
    bid(acme, 8, 3_000_000)

    with CaptureQueriesContext(connection) as few:
        api_client.get("/api/v1/markets/H100-80GB/book/")
    for n in range(12):
        bid(rival if n % 2 else acme, 1 + n, 1_000_000 + 100_000 * n,
            within=("node", "leaf", "spine", None)[n % 4])
    with CaptureQueriesContext(connection) as many:
        levels = api_client.get("/api/v1/markets/H100-80GB/book/").json()["levels"]

    assert len(levels) == 13
    assert len(many) == len(few) <= 5

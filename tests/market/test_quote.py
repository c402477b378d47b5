"""`POST /api/v1/quote/`: what an order would get now, placing nothing."""

import pytest
from django.db import connection

from billing import services as money
from billing.core.money import to_dollars
from billing.models import Hold
from market import prices
from market.models import Allocation, Lease, Order
from pool.models import Node
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes

ORDER = {"gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "tier": "on_demand",
         "max_price_per_gpu_hour": "3.00"}
SHARE = {"gpu_models": ["H100-80GB"], "gpu_share": 250, "count": 1, "hours": 2,
         "tier": "on_demand", "max_price_per_gpu_hour": "1.00"}


@pytest.fixture
def provider(db):
    """4 nodes of 8 H100s (2 leaves of 2 nodes) at 2.50, one node at 2.40, all shareable."""
    provider = provider_with_nodes(nodes=4)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_500_000,
                      actor="test", shareable=True)
    prices.set_prices(provider=provider, scope={"node": gpus_of(provider)[8].node.hostname},
                      price_micros=2_400_000, actor="test")
    return provider


@pytest.fixture
def tenant(db):
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


@pytest.fixture
def tenant_client(tenant):
    return client_for(tenant, scopes=("read", "trade"))


def quote(client, **changes):
    return client.post("/api/v1/quote/", {**ORDER, **changes}, format="json")


def order(client, **changes):
    return client.post("/api/v1/orders/", {**ORDER, **changes}, format="json")


def written() -> dict:
    """Rows a quote must never leave behind, and the ledger's entries."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM market_entry")
        entries = cursor.fetchone()[0]
    return {"orders": Order.objects.count(), "leases": Lease.objects.count(),
            "holds": Hold.objects.count(), "allocations": Allocation.objects.count(),
            "entries": entries}


def test_an_on_demand_quote_answers_what_the_order_would_get(provider, tenant_client):
    response = quote(tenant_client)

    body = response.json()
    assert response.status_code == 200, body
    cheap_node = gpus_of(provider)[8].node.hostname
    assert body == {"fillable": True, "tier": "on_demand", "gpus": 8,
                    "price_per_gpu_hour": "2.40", "total": "38.40",
                    "locality": {"leaves": 1, "spines": 1, "max_hops": 0},
                    "placement": [{"node": cheap_node, "index": i} for i in range(8)],
                    "reason": ""}


def test_the_order_placed_after_a_fillable_quote_gets_the_same_price_and_gpus(
        provider, tenant_client):
    quoted = quote(tenant_client, gpus=12, topology={"required": "leaf"}).json()

    placed = order(tenant_client, gpus=12, topology={"required": "leaf"}).json()

    lease = Lease.objects.get(pk=placed["lease"])
    held = sorted(Allocation.objects.filter(lease=lease).values_list("gpu__node__hostname",
                                                                     "gpu__index"))
    assert quoted["fillable"] and placed["state"] == "filled"
    assert quoted["price_per_gpu_hour"] == to_dollars(lease.price_micros)
    assert [(p["node"], p["index"]) for p in quoted["placement"]] == held
    assert quoted["locality"] == lease.locality


def test_a_quote_places_holds_and_writes_nothing(provider, tenant_client):
    before = written()

    assert quote(tenant_client).json()["fillable"] is True
    assert tenant_client.post("/api/v1/quote/", SHARE, format="json").json()["fillable"] is True
    assert quote(tenant_client, tier="spot").json()["fillable"] is True

    assert written() == before


def test_a_quote_that_cannot_be_filled_says_why_as_the_order_would(provider, tenant_client):
    quoted = quote(tenant_client, max_price_per_gpu_hour="2.00").json()
    placed = order(tenant_client, max_price_per_gpu_hour="2.00").json()

    assert quoted["fillable"] is False
    assert quoted["reason"] == placed["reason"] == (
        "the cheapest placement needs GPUs at up to 2.40 per GPU-hour, above the limit 2.00")
    assert (quoted["price_per_gpu_hour"], quoted["total"], quoted["locality"],
            quoted["placement"]) == (None, None, None, [])


def test_a_tenant_without_the_money_is_quoted_unfillable(provider):
    poor = client_for(make_org("poor-labs", "tenant"), scopes=("read",))

    body = quote(poor).json()

    assert body["fillable"] is False
    assert body["reason"].startswith("insufficient funds")


@pytest.mark.parametrize("changes", [
    {"gpu_models": ["Z9000"]},
    {"gpus": 100},  # no fabric has 100 GPUs
    {"gpu_share": 250},  # gpus and gpu_share at once
    {"tier": "reserved"},  # no start window
    {"max_price_per_gpu_hour": "2.5000001"},
])
def test_bad_input_is_the_same_400_as_an_order(provider, tenant_client, changes):
    quoted = quote(tenant_client, **changes)
    placed = order(tenant_client, **changes)

    assert quoted.status_code == placed.status_code == 400
    assert quoted.json() == placed.json()


def test_a_share_quote_names_the_gpu_and_share_the_order_then_gets(provider, tenant_client):
    quoted = tenant_client.post("/api/v1/quote/", SHARE, format="json").json()

    placed = tenant_client.post("/api/v1/orders/", SHARE, format="json").json()

    allocation = Allocation.objects.select_related("gpu__node").get(lease_id=placed["lease"])
    assert quoted["fillable"] is True
    assert quoted["price_per_gpu_hour"] == "0.60"  # a quarter of the 2.40 GPU
    assert quoted["placement"] == [{"node": allocation.gpu.node.hostname,
                                    "index": allocation.gpu.index, "share": 250}]


def test_a_spot_quote_estimates_the_clearing_at_the_highest_reserve_price(provider,
                                                                          tenant_client):
    body = quote(tenant_client, tier="spot", gpus=12).json()

    assert body["fillable"] is True
    assert body["price_per_gpu_hour"] == "2.50"  # 8 GPUs at 2.40 and 4 at 2.50: uniform 2.50
    assert body["total"] == "60.00"
    assert body["reason"].startswith("an estimate: spot orders are filled at the next clearing")


def test_a_read_only_key_may_ask_for_a_quote_but_a_provider_may_not(provider, tenant):
    reader = client_for(tenant, scopes=("read",))
    provider_client = client_for(provider, scopes=("read", "provide"))

    assert quote(reader).status_code == 200
    assert quote(provider_client).status_code == 403

"""Parts of GPUs on the market: MIG slices and shares, ordered, priced, held and refused."""

import threading

import pytest
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange, NumericRange
from django.utils import timezone

from billing import services as money
from billing.models import Hold
from market import auctions, leasing, prices
from market.core.parts import MixItem
from market.models import Allocation, Lease, Order
from market.orders import OrderError, OrderRequest, place_order
from market.parts import recent_mix
from pool.models import Gpu, Node
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes

SHARE = {"gpu_models": ["H100-80GB"], "gpu_share": 250, "count": 1, "hours": 2,
         "tier": "on_demand", "max_price_per_gpu_hour": "1.00"}
SLICE = {"gpu_models": ["H100-80GB"], "mig_profile": "1g.10gb", "count": 1, "hours": 2,
         "tier": "on_demand", "max_price_per_gpu_hour": "1.00"}


@pytest.fixture
def provider(db):
    """Two nodes of 8 H100s at 2.80 per GPU-hour, every GPU shareable."""
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_800_000,
                      actor="test", shareable=True)
    return provider


def tenant_named(slug):
    tenant = make_org(slug, "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


@pytest.fixture
def tenant(db):
    return tenant_named("acme-ai")


@pytest.fixture
def tenant_client(tenant):
    return client_for(tenant)


def order(client, base, **changes):
    body = {**base, **changes}
    return client.post("/api/v1/orders/", {k: v for k, v in body.items() if v is not None},
                       format="json")


def test_a_share_is_sold_pro_rata_and_shows_in_the_lease(provider, tenant_client):
    response = order(tenant_client, SHARE)

    body = response.json()
    assert response.status_code == 201, body
    assert body["state"] == "filled" and body["gpu_share"] == 250
    lease = Lease.objects.get(pk=body["lease"])
    assert (lease.gpu_share, lease.gpu_count, lease.price_micros) == (250, 1, 700_000)
    allocation = Allocation.objects.get(lease=lease)
    assert (allocation.part, allocation.span.upper - allocation.span.lower) == ("share", 250)
    shown = tenant_client.get(f"/api/v1/leases/{lease.pk}/").json()
    assert shown["gpus"] == [{"node": allocation.gpu.node.hostname,
                              "index": allocation.gpu.index, "share": 250, "device": None,
                              "enforced": None, "error": ""}]
    assert shown["price_per_gpu_hour"] == "0.70"
    assert Hold.objects.get(order_ref=f"order-{body['id']}").amount_micros == 1 * 2 * 1_000_000


def test_a_mig_slice_is_priced_by_its_share_of_compute_unless_the_provider_priced_it(
        provider, tenant_client):
    first = order(tenant_client, SLICE).json()
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_800_000,
                      actor="test", slice_prices={"1g.10gb": 300_000})
    second = order(tenant_client, SLICE).json()

    assert Lease.objects.get(pk=first["lease"]).price_micros == 400_000  # 2.80 × 1/7
    assert Lease.objects.get(pk=second["lease"]).price_micros == 300_000
    held = Allocation.objects.get(lease_id=first["lease"])
    assert (held.part, held.mig_profile, held.span) == ("mig", "1g.10gb", NumericRange(0, 125))


def test_slices_of_one_order_share_a_gpu_already_broken_before_a_whole_one(provider,
                                                                         tenant_client):
    assert order(tenant_client, SLICE, mig_profile="3g.40gb",
                 max_price_per_gpu_hour="2.00").json()["state"] == "filled"

    body = order(tenant_client, SLICE, count=2).json()

    gpus = set(Allocation.objects.values_list("gpu_id", flat=True))
    assert body["state"] == "filled" and len(gpus) == 1
    spans = sorted(Allocation.objects.values_list("span", flat=True), key=lambda s: s.lower)
    # positions 0-3, then 4 and 5: the last two stay free together for a 2g
    assert [(s.lower, s.upper) for s in spans] == [(0, 500), (500, 625), (625, 750)]


def test_two_tenants_shares_go_on_one_gpu(provider, tenant_client):
    rival = client_for(tenant_named("rival-labs"))

    first = order(tenant_client, SHARE, gpu_share=500, max_price_per_gpu_hour="2.00").json()
    second = order(rival, SHARE, gpu_share=500, max_price_per_gpu_hour="2.00").json()

    a = Allocation.objects.get(lease_id=first["lease"])
    b = Allocation.objects.get(lease_id=second["lease"])
    assert a.gpu_id == b.gpu_id
    assert {(a.span.lower, a.span.upper), (b.span.lower, b.span.upper)} == {(0, 500), (500, 1000)}
    assert Lease.objects.get(pk=first["lease"]).tenant != Lease.objects.get(
        pk=second["lease"]).tenant


def test_shares_of_one_order_are_on_distinct_gpus_of_one_node(provider, tenant_client):
    body = order(tenant_client, SHARE, gpu_share=500, count=3, max_price_per_gpu_hour="2.00").json()

    held = list(Allocation.objects.filter(lease_id=body["lease"]).select_related("gpu"))
    assert len({a.gpu_id for a in held}) == 3
    assert len({a.gpu.node_id for a in held}) == 1


def test_a_gpu_with_a_part_is_not_sold_whole_until_the_part_ends(provider, tenant_client):
    order(tenant_client, SHARE)

    whole = order(tenant_client, {"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1,
                                  "tier": "on_demand", "max_price_per_gpu_hour": "3.00"}).json()
    assert whole["state"] == "refused"
    assert order(tenant_client, {"gpu_models": ["H100-80GB"], "gpus": 15, "hours": 1,
                                 "tier": "on_demand", "max_price_per_gpu_hour": "3.00"}
                 ).json()["state"] == "filled"


def test_a_slice_is_refused_with_its_reason_when_no_legal_position_is_free(provider,
                                                                         tenant_client):
    Gpu.objects.exclude(pk=gpus_of(provider)[0].pk).update(shareable=False)
    order(tenant_client, SLICE, mig_profile="3g.40gb", max_price_per_gpu_hour="2.00")  # at 0

    body = order(tenant_client, SLICE, mig_profile="4g.40gb", max_price_per_gpu_hour="2.00"
                 ).json()  # 4g starts at 0 only

    assert body["state"] == "refused"
    assert body["reason"] == "no legal position for 4g.40gb (starts 0) is free on 1 GPU"
    assert Lease.objects.count() == 1
    assert Hold.objects.get(order_ref=f"order-{body['id']}").state == "closed"


def test_parts_are_sold_only_on_gpus_the_provider_marked_shareable(provider, tenant_client):
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_800_000,
                      actor="test", shareable=False)

    body = order(tenant_client, SHARE).json()

    assert body["state"] == "refused"
    assert body["reason"] == "no shareable GPU of these models sells share"


def test_a_share_above_the_limit_is_refused_with_the_cheapest_price(provider, tenant_client):
    body = order(tenant_client, SHARE, max_price_per_gpu_hour="0.50").json()

    assert body["state"] == "refused"
    assert body["reason"] == ("no share within the limit: the cheapest is 700000 µ$ per hour "
                              "(limit 500000)")


@pytest.mark.parametrize("changes, fields", [
    ({"gpus": 2}, {"gpus", "gpu_share"}),
    ({"gpu_share": None, "count": None}, {"gpus", "mig_profile", "gpu_share"}),
    ({"mig_profile": "1g.10gb"}, {"mig_profile", "gpu_share"}),
    ({"count": None}, {"count"}),
    ({"gpu_share": 1000}, {"gpu_share"}),
    ({"gpu_share": 0}, {"gpu_share"}),
    ({"tier": "reserved", "start_window": {"earliest": "2030-01-01T00:00:00Z",
                                           "latest": "2030-01-02T00:00:00Z"}}, {"tier"}),
    ({"topology": {"required": "leaf"}}, {"topology"}),
    ({"topology": {"whole_nodes": True}}, {"topology"}),
    ({"pool": "research"}, {"pool"}),
])
def test_a_malformed_order_for_parts_is_a_400_naming_the_fields_and_changes_nothing(
        provider, tenant_client, changes, fields):
    response = order(tenant_client, SHARE, **changes)

    assert response.status_code == 400, response.content
    assert fields <= set(response.json()["error"]["fields"]), response.json()
    assert Order.objects.count() == 0 and Lease.objects.count() == 0


def test_parts_are_not_lent_by_private_pools(provider, tenant_client, tenant):
    with pytest.raises(OrderError) as refused:
        place_order(tenant=tenant, actor="test", request=OrderRequest(
            gpu_models=["H100-80GB"], gpus=1, gpu_share=250, hours=1, tier="on_demand",
            max_price_micros=0, pool="any-pool"))

    assert refused.value.field == "pool" and "public market" in refused.value.message
    assert Order.objects.count() == 0


def test_a_mig_profile_no_ordered_model_has_is_a_400(provider, tenant_client):
    response = order(tenant_client, SLICE, mig_profile="1g.5gb")

    assert response.status_code == 400
    assert "mig_profile" in str(response.json())
    assert Order.objects.count() == 0


def test_a_provider_marks_gpus_shareable_and_prices_slices_through_the_api(provider):
    client = client_for(provider)

    response = client.post("/api/v1/prices/", {
        "scope": {"fabric": "lab"}, "price_per_gpu_hour": "3.50", "shareable": True,
        "price_per_slice_hour": {"1g.10gb": "0.45"}}, format="json")
    bad = client.post("/api/v1/prices/", {
        "scope": {"fabric": "lab"}, "price_per_gpu_hour": "3.50",
        "price_per_slice_hour": {"1g.5gb": "0.45"}}, format="json")

    assert response.status_code == 201, response.content
    assert bad.status_code == 400 and "price_per_slice_hour.1g.5gb" in str(bad.json())
    current = client.get("/api/v1/prices/?current=true").json()["results"][0]
    assert current["price_per_slice_hour"] == {"1g.10gb": "0.45"}
    assert current["price_per_gpu_hour"] == "3.50"
    assert Gpu.objects.filter(shareable=True).count() == 16


def test_a_spot_share_is_filled_at_the_clearing_at_its_posted_price(provider, tenant_client):
    body = order(tenant_client, SHARE, tier="spot").json()
    assert body["state"] == "resting"

    auctions.clear_markets(now=timezone.now())

    filled = Order.objects.get(pk=body["id"])
    assert filled.state == "filled"
    lease = filled.lease
    assert (lease.tier, lease.gpu_share, lease.price_micros) == ("spot", 250, 700_000)
    assert lease.allow_moves


# --- the invariants, in the database -----------------------------------------------------------


def allocation(lease, gpu, part="share", span=(0, 500), profile=""):
    now = timezone.now()
    return Allocation(lease=lease, gpu=gpu, part=part, span=NumericRange(*span),
                      mig_profile=profile, price_micros=1,
                      period=DateTimeTZRange(now, now + timezone.timedelta(hours=1)))


@pytest.fixture
def two_leases(provider, tenant):
    now = timezone.now()
    return [Lease.objects.create(tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
                                 gpu_count=1, gpu_share=500, price_micros=1,
                                 max_price_micros=1, starts_at=now,
                                 ends_at=now + timezone.timedelta(hours=1)) for _ in range(2)]


@pytest.mark.parametrize("first, second", [
    (("share", (0, 500), ""), ("share", (250, 750), "")),  # overlapping shares
    (("whole", (0, 1000), ""), ("share", (0, 250), "")),  # a share beside a whole GPU
    (("mig", (0, 125), "1g.10gb"), ("share", (500, 750), "")),  # slices and shares mixed
    (("mig", (0, 500), "3g.40gb"), ("mig", (0, 500), "4g.40gb")),  # one position twice
])
def test_the_database_refuses_parts_that_cannot_share_a_gpu(two_leases, provider, first,
                                                            second):
    gpu = gpus_of(provider)[0]
    allocation(two_leases[0], gpu, first[0], first[1], first[2]).save()

    with pytest.raises(IntegrityError, match="no_gpu_in_two_overlapping_allocations"), \
            transaction.atomic():
        allocation(two_leases[1], gpu, second[0], second[1], second[2]).save()


def test_the_database_takes_disjoint_shares_of_one_gpu(two_leases, provider):
    gpu = gpus_of(provider)[0]
    allocation(two_leases[0], gpu, span=(0, 500)).save()
    allocation(two_leases[1], gpu, span=(500, 1000)).save()

    assert Allocation.objects.filter(gpu=gpu).count() == 2


@pytest.mark.django_db(transaction=True)
def test_racing_share_orders_never_oversell_a_gpu(provider):
    Gpu.objects.exclude(pk=gpus_of(provider)[0].pk).update(shareable=False)
    clients = [client_for(tenant_named(f"racer-{i}")) for i in range(4)]
    results, barrier = [], threading.Barrier(4)

    def race(client):
        barrier.wait()
        try:
            results.append(order(client, SHARE, gpu_share=400, max_price_per_gpu_hour="2.00").json()["state"])
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == ["filled", "filled", "refused", "refused"]
    spans = [a.span for a in Allocation.objects.all()]
    assert sum(s.upper - s.lower for s in spans) == 800


def test_the_mix_placements_are_measured_against_is_learnt_from_recent_orders(provider, tenant):
    for _ in range(15):
        Order.objects.create(tenant=tenant, gpu_models=["H100-80GB"], gpus=1, gpu_share=250,
                             hours=1, tier="on_demand", max_price_micros=1)
    assert recent_mix() == ()  # too few orders to learn from: the placer's own mix
    cache.delete("ibex:parts-mix")
    for _ in range(5):
        Order.objects.create(tenant=tenant, gpu_models=["H100-80GB"], gpus=8, hours=1,
                             tier="on_demand", max_price_micros=1)

    mix = recent_mix()

    assert [(item.gpus, item.gpu_milli, item.weight) for item in mix] == [
        (1, 250, 0.75), (8, 1000, 0.25)]


def test_an_on_demand_gpu_is_placed_against_the_recent_mix(provider, tenant, tenant_client):
    now = timezone.now()
    gpus = gpus_of(provider)  # two nodes of 8
    leasing.create_lease(
        tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
        gpus=[leasing.GpuChoice(g.pk, 1) for g in gpus[:4] + gpus[8:11]], starts_at=now,
        ends_at=now + timezone.timedelta(hours=3), price_micros=1, max_price_micros=1,
        locality={}, actor="test")  # 4 free on the first node, 5 on the second
    one_gpu = {"gpu_models": ["H100-80GB"], "gpus": 1, "hours": 1, "tier": "on_demand",
               "max_price_per_gpu_hour": "3.00"}
    cache.set("ibex:parts-mix", (MixItem(1000, 0, 0.5, 1), MixItem(1000, 0, 0.5, 4)), 60)

    placed = order(tenant_client, one_gpu).json()

    # best fit would leave 3 + 5; against a mix of 1- and 4-GPU orders, 4 + 4 strands less
    [gpu] = Allocation.objects.filter(lease_id=placed["lease"]).values_list("gpu", flat=True)
    assert gpu in {g.pk for g in gpus[8:]}

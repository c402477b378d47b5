"""Guaranteed orders are placed only where every link on the routes between their nodes keeps
the sum of guarantees within its rate × the fabric's guarantee ratio; a refusal names the link.
Standard orders are unaffected. (No agent here: the routes are derived from the topology; the
live tests in tests/fabric/live/test_admission_live.py use OpenSM's.)

The fabric: two leaves of two 8-GPU nodes, 400 Gb/s cables, ratio 0.8: 320 Gb/s a link."""

from decimal import Decimal

import pytest

from billing import services as money
from fabric.models import Fabric
from ibex.outbox.models import OutboxMessage
from market import leasing, prices
from market.models import Allocation, Lease, LeaseEvent, Order
from pool.models import Gpu, Node
from scheduler import placing
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes
from tests.scheduler.moves.test_remediation import setup_market
from tests.scheduler.pools.test_pool_guarantees import spread_two_and_two


def order(client, gbps=None, gpus=16, cls="guaranteed"):
    body = {"gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 2, "tier": "on_demand",
            "max_price_per_gpu_hour": "3.00",
            "bandwidth": {"class": cls, "gbps_per_gpu": gbps} if cls == "guaranteed"
            else {"class": cls}}
    answer = client.post("/api/v1/orders/", body, format="json")
    assert answer.status_code in (200, 201), answer.json()
    return Order.objects.get(pk=answer.json()["id"])


def test_a_guarantee_that_would_overfill_a_nodes_link_is_refused_naming_it(db):
    client = setup_market()

    refused = order(client, gbps=45)  # a node sends 8 × 45 = 360 Gb/s to the next: > 320
    standard = order(client, cls="standard")

    assert refused.state == "refused" and refused.lease is None
    assert "its guaranteed bandwidth does not fit: hpc-provider-0" in refused.reason
    assert " port 1 → leaf" in refused.reason
    assert "would carry 360 Gb/s of guarantees (0 held + 360 new), above its 320 Gb/s " \
           "(400 Gb/s × guarantee ratio 0.8)" in refused.reason
    assert standard.state == "filled" and standard.lease is not None


def test_a_guarantee_that_fits_is_placed_and_the_next_one_that_would_share_its_links_is_not(db):
    client = setup_market()

    first = order(client, gbps=25)  # 200 Gb/s a hop
    second = order(client, gbps=25, gpus=16)

    assert first.state == "filled"
    lease = Lease.objects.get(pk=first.lease_id)
    assert lease.allocations.count() == 16
    # the second takes the two other nodes (its own links): nothing shared, it fits too
    assert second.state == "filled"
    third = order(client, gbps=25, gpus=8)  # one node: no cable crossed, nothing to refuse
    assert third.state == "refused" and "guaranteed" not in third.reason  # no GPUs left


def test_a_lower_guarantee_ratio_refuses_what_the_default_placed(db):
    client = setup_market()
    fabric = Fabric.objects.get()
    owner = client_for(fabric.owner)

    answer = owner.patch(f"/api/v1/fabrics/{fabric.pk}/", {"guarantee_ratio": "0.5"},
                         format="json")
    refused = order(client, gbps=30)  # 240 Gb/s a hop, above 400 × 0.5

    assert answer.status_code == 200 and answer.json()["guarantee_ratio"] == "0.500"
    # the live guarantees are checked again on the new ratio
    assert OutboxMessage.objects.filter(task="scheduler.recheck_guarantees",
                                        args=[fabric.pk]).exists()
    assert refused.state == "refused" and "above its 200 Gb/s" in refused.reason
    owner.patch(f"/api/v1/fabrics/{fabric.pk}/", {"guarantee_ratio": "0.8"}, format="json")
    assert order(client, gbps=30).state == "filled"


@pytest.mark.parametrize("ratio", ["0", "-0.1", "1.5", "abc", None, "12"])
def test_a_guarantee_ratio_outside_0_to_1_is_refused_naming_the_field(db, ratio):
    setup_market()
    fabric = Fabric.objects.get()

    answer = client_for(fabric.owner).patch(f"/api/v1/fabrics/{fabric.pk}/",
                                            {"guarantee_ratio": ratio}, format="json")

    assert answer.status_code == 400, answer.content
    assert "guarantee_ratio" in answer.json()["error"]["fields"]
    fabric.refresh_from_db()
    assert fabric.guarantee_ratio == Decimal("0.8")


def test_a_tenant_cannot_change_the_guarantee_ratio(db):
    client = setup_market()
    fabric = Fabric.objects.get()

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/", {"guarantee_ratio": "0.5"},
                          format="json")

    assert answer.status_code in (403, 404)
    fabric.refresh_from_db()
    assert fabric.guarantee_ratio == Decimal("0.8")


def spread_over_two_nodes(lease: Lease) -> None:
    """What a batch auction may clear: the lease's 8 GPUs as 4 + 4 on two nodes of a leaf."""
    leaf = Node.objects.order_by("hostname").first().host.leaf
    nodes = list(Node.objects.filter(host__leaf=leaf).order_by("hostname")[:2])
    gpus = [g for node in nodes for g in Gpu.objects.filter(node=node).order_by("index")[:4]]
    Allocation.objects.filter(lease=lease).delete()
    leasing.replace_allocations(lease=lease, gpus=[leasing.GpuChoice(g.pk, 2_000_000)
                                                   for g in gpus],
                                gpu_model="H100-80GB", locality={}, price_micros=2_000_000,
                                reason="cleared by the auction", starts_at=lease.starts_at)


def test_a_lease_whose_cleared_gpus_would_break_its_guarantee_is_placed_again_where_it_holds(db):
    client = setup_market()
    won = order(client, gbps=45, gpus=8)  # 4 × 45 = 180 Gb/s a hop once on two nodes
    lease = Lease.objects.get(pk=won.lease_id)
    spread_over_two_nodes(lease)
    Fabric.objects.update(guarantee_ratio=Decimal("0.4"))  # 160 Gb/s a link

    placing.place_lease(lease_id=lease.pk)

    lease.refresh_from_db()
    assert lease.state == "placing"
    nodes = set(lease.allocations.values_list("gpu__node__hostname", flat=True))
    assert len(nodes) == 1  # one node: no cable to overfill
    moved = LeaseEvent.objects.filter(lease=lease, kind="moved").latest("id")
    assert moved.reason.startswith("its guaranteed bandwidth does not fit: ")
    assert "above its 160 Gb/s (400 Gb/s × guarantee ratio 0.4)" in moved.reason


def test_a_lease_whose_guarantee_fits_nowhere_fails_at_placement_naming_the_link(db):
    client = setup_market()
    won = order(client, gbps=45, gpus=8)
    lease = Lease.objects.get(pk=won.lease_id)
    spread_over_two_nodes(lease)
    for _ in range(3):  # every other whole node taken by standard leases
        assert order(client, gpus=8, cls="standard").state == "filled"
    Fabric.objects.update(guarantee_ratio=Decimal("0.4"))

    placing.place_lease(lease_id=lease.pk, final=True)

    lease.refresh_from_db()
    assert lease.state == "failed"
    failed = LeaseEvent.objects.filter(lease=lease, to_state="failed").get()
    assert "its guaranteed bandwidth does not fit: hpc-provider-0" in failed.reason
    assert "port 1 → leaf" in failed.reason and "above its 160 Gb/s" in failed.reason


def test_an_on_demand_guarantee_goes_to_the_leaf_with_the_most_headroom(db):
    client = setup_market()
    held = order(client, gbps=45, gpus=4)
    spread_two_and_two(Lease.objects.get(pk=held.lease_id))  # 90 Gb/s on leaf 1's node links
    tight_leaf = Node.objects.order_by("hostname").first().host.leaf

    placed = order(client, gbps=10, gpus=12)

    # leaf 1 (6 + 6 free) is the tightest fit; leaf 2 (8 + 4) keeps 240 Gb/s on its tightest
    # link against leaf 1's 170
    assert placed.state == "filled"
    leaves = set(Allocation.objects.filter(lease_id=placed.lease_id)
                 .values_list("gpu__node__host__leaf", flat=True))
    assert leaves and tight_leaf not in leaves


def rail_optimised_market():
    provider = provider_with_nodes(nodes=4, rails=8)  # one HCA per GPU, each on its rail's leaf
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000_000_000, reason="t", actor="t")
    return client_for(tenant)


def test_on_rail_optimised_nodes_each_gpu_sends_on_its_own_rail_so_more_fits(db):
    client = rail_optimised_market()

    placed = order(client, gbps=45, gpus=16)  # 45 Gb/s on each rail's cable, not 360 on one

    assert placed.state == "filled", placed.reason
    assert Allocation.objects.filter(lease_id=placed.lease_id).count() == 16


def test_on_rail_optimised_nodes_a_refusal_names_a_rails_cable(db):
    client = rail_optimised_market()

    refused = order(client, gbps=350, gpus=16)  # 350 on each rail's cable, above 320

    assert refused.state == "refused"
    assert "would carry 350 Gb/s of guarantees (0 held + 350 new), above its 320 Gb/s" \
        in refused.reason

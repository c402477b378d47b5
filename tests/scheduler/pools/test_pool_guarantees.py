"""A private pool's guaranteed orders are admitted on the routes too: their lease is placed by
the pool's placer and checked on the fabric's links before it is bound (docs/fabric.md,
"Admission on the real routes"). The pool: four 8-GPU nodes, two a leaf, 400 Gb/s cables."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from market import leasing, orders
from market.models import Allocation, Order
from pool.models import Gpu, Node
from scheduler import placing
from scheduler.pools import admission
from tests.factories import make_org
from tests.scheduler.pools.builders import H100, admit, private_pool, queue


def guaranteed_pool_order(org, pool, gbps: str, gpus=16):
    return orders.place_order(tenant=org, actor="test", request=orders.OrderRequest(
        gpu_models=[H100], gpus=gpus, hours=4, tier="on_demand", max_price_micros=0,
        pool=pool.name, queue="", bandwidth_class="guaranteed", gbps_per_gpu=Decimal(gbps)))


def pool_lease(db, gbps):
    chemistry = make_org("chemistry-dept", "tenant")
    pool = private_pool(nodes=4)
    queue(pool, "chemistry", chemistry, nominal=32)
    placed = guaranteed_pool_order(chemistry, pool, gbps)
    admit(pool)
    placed.refresh_from_db()
    assert placed.state == "filled", placed.reason
    return placed.lease


def test_a_pool_lease_whose_guarantee_fits_is_bound(db):
    lease = pool_lease(db, "25")  # 8 × 25 = 200 Gb/s a hop, within 320

    lease = placing.place_lease(lease_id=lease.pk, final=True)

    assert lease.state == "placing"


def test_a_pool_order_whose_guarantee_fits_nowhere_in_its_pool_waits_naming_the_link(db):
    chemistry = make_org("chemistry-dept", "tenant")
    pool = private_pool(nodes=4)
    queue(pool, "chemistry", chemistry, nominal=32)
    placed = guaranteed_pool_order(chemistry, pool, "45")  # 8 × 45 = 360 Gb/s a hop: > 320

    admit(pool)

    placed.refresh_from_db()
    assert placed.state == "queued" and placed.lease is None
    assert placed.reason.startswith("within quota, but no room to place it: its guaranteed "
                                    "bandwidth does not fit: campus-hpc-0")
    assert " port 1 → leaf" in placed.reason and "above its 320 Gb/s" in placed.reason


def spread_two_and_two(lease) -> None:
    """The lease's 4 GPUs as 2 + 2 on the first leaf's two nodes: its guarantee loads both
    nodes' links."""
    leaf = Node.objects.order_by("hostname").first().host.leaf
    gpus = [g for node in Node.objects.filter(host__leaf=leaf).order_by("hostname")
            for g in Gpu.objects.filter(node=node).order_by("index")[:2]]
    Allocation.objects.filter(lease=lease).delete()
    leasing.replace_allocations(lease=lease, gpus=[leasing.GpuChoice(g.pk, 0) for g in gpus],
                                gpu_model=H100, locality={}, price_micros=0,
                                reason="placed by hand", starts_at=lease.starts_at)


def test_a_pool_guarantee_goes_to_the_leaf_with_the_most_headroom_not_the_tightest_fit(db):
    chemistry = make_org("chemistry-dept", "tenant")
    pool = private_pool(nodes=4)  # leaf 1: nodes 0 and 1; leaf 2: nodes 2 and 3
    queue(pool, "chemistry", chemistry, nominal=32)
    first = guaranteed_pool_order(chemistry, pool, "45", gpus=4)
    admit(pool)
    first.refresh_from_db()
    spread_two_and_two(first.lease)  # 90 Gb/s held on each of leaf 1's node links
    tight_leaf = Node.objects.order_by("hostname").first().host.leaf
    second = guaranteed_pool_order(chemistry, pool, "10", gpus=12)
    standard = Order(pk=0, gpus=12, gpu_models=[H100], hours=4, topology={},
                     quota_node=second.quota_node)
    placer = admission.PoolPlacer(pool, timezone.now(), timezone.now() + timedelta(hours=4), {})

    engine_alone, _ = placer.place(standard)
    admit(pool)

    # the engine's tightest fit is leaf 1's 6 + 6 free GPUs; leaf 2 (8 + 4) keeps 240 Gb/s
    # free on its tightest link against leaf 1's 170
    assert {key.leaf for key, _gpu in engine_alone} == {tight_leaf}
    second.refresh_from_db()
    assert second.state == "filled", second.reason
    leaves = set(Allocation.objects.filter(lease=second.lease)
                 .values_list("gpu__node__host__leaf", flat=True))
    assert leaves and tight_leaf not in leaves

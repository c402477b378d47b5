"""A private pool's guaranteed orders are admitted on the routes too: their lease is placed by
the pool's placer and checked on the fabric's links before it is bound (docs/fabric.md,
"Admission on the real routes"). The pool: four 8-GPU nodes, two a leaf, 400 Gb/s cables."""

from decimal import Decimal

from market import orders
from market.models import LeaseEvent
from scheduler import placing
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


def test_a_pool_lease_whose_guarantee_fits_nowhere_in_its_pool_fails_naming_the_link(db):
    lease = pool_lease(db, "45")  # 8 × 45 = 360 Gb/s a hop: above 320 on any cable

    lease = placing.place_lease(lease_id=lease.pk, final=True)

    assert lease.state == "failed"
    reason = LeaseEvent.objects.get(lease=lease, to_state="failed").reason
    assert "its guaranteed bandwidth does not fit: " in reason
    assert " port 1 → leaf" in reason and "above its 320 Gb/s" in reason

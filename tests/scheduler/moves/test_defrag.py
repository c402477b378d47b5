from datetime import timedelta

from django.utils import timezone

from market import leasing
from market.models import Allocation, LeaseEvent
from pool.models import Binding, Gpu, Node
from scheduler import placing as scheduler
from scheduler.models import DefragRun
from scheduler.moves import defrag
from tests.factories import make_org
from tests.scheduler.moves.test_remediation import setup_market

PRICE = 2_000_000


def running_lease(tenant, node: Node, tier="spot", allow_moves=True):
    """An active lease of the node's 8 GPUs at their posted price."""
    now = timezone.now()
    lease = leasing.create_lease(
        tenant=tenant, tier=tier, gpu_model="H100-80GB",
        gpus=[leasing.GpuChoice(g.pk, PRICE) for g in Gpu.objects.filter(node=node)],
        starts_at=now, ends_at=now + timedelta(hours=2), price_micros=PRICE,
        max_price_micros=PRICE, locality={"leaves": 1, "spines": 1, "max_hops": 0},
        actor="test", allow_moves=allow_moves)
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=now)
    scheduler.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def layout():
    """Two leaves of two nodes: (a1, a2), (b1, b2)."""
    setup_market()
    nodes = list(Node.objects.order_by("host__leaf", "hostname"))
    assert nodes[0].host.leaf == nodes[1].host.leaf != nodes[2].host.leaf == nodes[3].host.leaf
    return make_org("acme-ai-2", "tenant"), nodes


def nodes_of(lease) -> set[int]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node_id", flat=True))


def test_a_spot_lease_that_allowed_moves_joins_the_other_leaf_and_frees_its_own(db):
    tenant, (a1, a2, b1, b2) = layout()
    steady = running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    spot = running_lease(tenant, b1)

    run = defrag.defragment()

    assert nodes_of(spot) == {a2.pk} and nodes_of(steady) == {a1.pk}
    assert (run.whole_free_leaves_before, run.whole_free_leaves_after) == (0, 1)
    assert (run.whole_free_nodes_before, run.whole_free_nodes_after) == (2, 2)
    assert run.moves_planned == run.moves_applied == 1
    assert DefragRun.objects.get() == run
    assert LeaseEvent.objects.get(lease=spot, kind="moved").reason.startswith("defragmentation")
    assert Binding.objects.get(node=b1, lease_ref=f"L-{spot.pk}").serve is False
    assert Binding.objects.get(node=a2, lease_ref=f"L-{spot.pk}").gpu_indexes == list(range(8))
    # what the tenant pays is unchanged
    assert set(Allocation.objects.filter(lease=spot).values_list("price_micros", flat=True)) == {
        PRICE}


def test_leases_without_consent_and_non_spot_leases_stay_where_they_are(db):
    tenant, (a1, a2, b1, b2) = layout()
    running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    refused = running_lease(tenant, b1, allow_moves=False)
    on_demand = running_lease(tenant, b2, tier="on_demand", allow_moves=True)

    run = defrag.defragment()

    assert nodes_of(refused) == {b1.pk} and nodes_of(on_demand) == {b2.pk}
    assert run.moves_planned == 0
    assert (run.whole_free_leaves_before, run.whole_free_leaves_after) == (0, 0)
    assert not LeaseEvent.objects.filter(kind="moved").exists()


def test_a_move_whose_target_was_taken_meanwhile_is_skipped_and_recorded(db, monkeypatch):
    tenant, (a1, a2, b1, b2) = layout()
    running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    spot = running_lease(tenant, b1)
    real_apply = defrag._apply

    def rival_first(move):
        running_lease(tenant, a2, tier="on_demand", allow_moves=False)  # a rival wins a2
        return real_apply(move)

    monkeypatch.setattr(defrag, "_apply", rival_first)
    run = defrag.defragment()

    assert nodes_of(spot) == {b1.pk}
    assert run.moves_planned == 1 and run.moves_applied == 0
    assert run.moves[0]["why"] == "a target GPU was taken meanwhile"
    assert run.whole_free_leaves_after == 0


def test_operators_see_each_pass_with_its_counts_in_the_admin(db, client):
    from django.contrib.auth import get_user_model

    tenant, (a1, a2, b1, b2) = layout()
    running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    running_lease(tenant, b1)
    defrag.defragment()
    client.force_login(get_user_model().objects.create_superuser("olga", "o@ibex.example", "pw"))

    page = client.get("/admin/scheduler/defragrun/")

    assert page.status_code == 200
    assert b"whole free leaves before" in page.content.lower()
    run = DefragRun.objects.get()
    assert client.get(f"/admin/scheduler/defragrun/{run.pk}/change/").status_code == 200

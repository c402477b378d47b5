from django.utils import timezone

from billing import services as money
from market import prices
from market.models import Allocation, Lease, LeaseEvent
from pool import services as pool
from pool.models import Binding, Gpu, Node
from scheduler import placing as scheduler
from scheduler.moves import remediation
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes


def active_lease(client, gpus=8, topology=None, allow_moves=None, workload=None) -> Lease:
    order = {"gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 2, "tier": "on_demand",
             "max_price_per_gpu_hour": "3.00", "topology": topology or {"required": "leaf"}}
    if workload is not None:
        order["workload"] = workload
    if allow_moves is not None:
        order["allow_moves"] = allow_moves
    body = client.post("/api/v1/orders/", order, format="json").json()
    lease = Lease.objects.get(pk=body["lease"])
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=lease.created_at)
    scheduler.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def setup_market():
    provider = provider_with_nodes(nodes=4)  # two leaves of two 8-GPU nodes
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000_000_000, reason="t", actor="t")
    return client_for(tenant)


def fail(gpu: Gpu) -> None:
    reports = [{"index": i} for i in range(8)]
    reports[gpu.index]["ecc_errors"] = 1
    pool.record_heartbeat(node=gpu.node, gpus=reports, ib_ports=[], serving=[])


def current_hosts(lease) -> set[str]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node__host__leaf", flat=True))


def test_a_failed_gpu_is_replaced_inside_the_promised_leaf_and_the_nodes_are_told(db):
    client = setup_market()
    lease = active_lease(client)
    first_gpu = Allocation.objects.filter(lease=lease).first().gpu
    leaf = first_gpu.node.host.leaf

    fail(first_gpu)
    outcome = remediation.remediate_leases()

    assert outcome == {lease.pk: "moved"}
    assert current_hosts(lease) == {leaf}  # still one leaf, as promised
    assert Allocation.objects.filter(lease=lease).count() == 9  # 8 now, 1 cut at the failure
    assert LeaseEvent.objects.filter(lease=lease, kind="moved").exists()
    nodes = {b.node_id: b for b in Binding.objects.filter(lease_ref=f"L-{lease.pk}", serve=True)}
    assert first_gpu.index not in nodes[first_gpu.node_id].gpu_indexes
    assert sum(len(b.gpu_indexes) for b in nodes.values()) == 8


def test_a_moved_lease_that_runs_a_command_restarts_it_on_every_node_and_says_so(db):
    client = setup_market()
    Node.objects.update(runtime="process")
    lease = active_lease(client, gpus=4, workload={"command": ["python3", "train.py"]})
    first_gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(first_gpu)
    remediation.remediate_leases()

    restarted = LeaseEvent.objects.get(lease=lease, kind="workload_restarted")
    assert "started again on every node" in restarted.reason
    ranks = Binding.objects.filter(lease_ref=f"L-{lease.pk}", serve=True)
    assert {(b.generation, b.launch["command"][1]) for b in ranks} == {(2, "train.py")}


def test_without_a_replacement_in_the_leaf_the_lease_is_degraded_not_moved_away(db):
    client = setup_market()
    lease = active_lease(client, gpus=16)  # the whole leaf
    gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(gpu)
    outcome = remediation.remediate_leases()
    again = remediation.remediate_leases()

    assert outcome == {lease.pk: "degraded"} and again == {lease.pk: "degraded"}
    assert LeaseEvent.objects.filter(lease=lease, kind="degraded").count() == 1
    assert not LeaseEvent.objects.filter(lease=lease, kind="moved").exists()


def test_healthy_leases_are_left_alone(db):
    client = setup_market()
    active_lease(client)

    assert remediation.remediate_leases() == {}


def test_a_preferred_leaf_is_no_promise_so_a_lease_moves_to_another_leaf_if_it_must(db):
    client = setup_market()
    lease = active_lease(client, gpus=16, topology={"preferred": "leaf"})  # a whole leaf
    gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(gpu)

    assert remediation.remediate_leases() == {lease.pk: "moved"}
    assert len(current_hosts(lease)) == 2  # now across two leaves


def fail_all(gpus: list[Gpu]) -> None:
    """One heartbeat per node reporting ECC errors on these GPUs."""
    by_node: dict = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, set()).add(gpu.index)
    for node, failed in by_node.items():
        reports = [{"index": i, **({"ecc_errors": 1} if i in failed else {})} for i in range(8)]
        pool.record_heartbeat(node=node, gpus=reports, ib_ports=[], serving=[])


def test_a_pass_reads_the_free_gpus_once_however_many_leases_it_moves(
        db, django_assert_max_num_queries):
    client = setup_market()
    leases = [active_lease(client, gpus=1) for _ in range(6)]
    fail_all([Allocation.objects.get(lease=lease).gpu for lease in leases])

    # ~18 a lease before; a few more for the hosts cut off and the leases' traffic accounts
    with django_assert_max_num_queries(30) as captured:
        outcome = remediation.remediate_leases()

    assert outcome == {lease.pk: "moved" for lease in leases}
    index_reads = [q for q in captured.captured_queries if '"market_gpuprice"' in q["sql"]]
    assert len(index_reads) == 1  # one free-GPU index for the whole pass


def test_a_replacement_taken_after_the_index_was_built_gives_way_to_the_next_free_gpu(
        db, monkeypatch):
    from datetime import timedelta

    from market import leasing
    from scheduler.moves.free_gpus import FreeIndex

    client = setup_market()
    lease = active_lease(client)
    first_gpu = Allocation.objects.filter(lease=lease).first().gpu
    neighbour = Gpu.objects.filter(node__host__leaf=first_gpu.node.host.leaf).exclude(
        node=first_gpu.node).order_by("pk")
    rival_gpu = neighbour.first()  # the cheapest replacement, lowest id first
    build = FreeIndex.build

    def rival_wins(now):
        index = build(now)
        leasing.create_lease(  # another worker sells it meanwhile
            tenant=lease.tenant, tier="on_demand", gpu_model="H100-80GB",
            gpus=[leasing.GpuChoice(rival_gpu.pk, 2_000_000)], starts_at=now,
            ends_at=now + timedelta(hours=1), price_micros=2_000_000,
            max_price_micros=2_000_000, locality={}, actor="rival")
        return index

    monkeypatch.setattr(FreeIndex, "build", staticmethod(rival_wins))
    fail(first_gpu)

    assert remediation.remediate_leases() == {lease.pk: "moved"}
    now_on = set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
                 .values_list("gpu_id", flat=True))
    assert rival_gpu.pk not in now_on and neighbour[1].pk in now_on
    assert LeaseEvent.objects.filter(lease=lease, kind="moved").count() == 1


def test_a_replacement_never_comes_from_another_fabric(db):
    client = setup_market()
    lease = active_lease(client, gpus=16, topology={"preferred": "leaf"})  # one leaf of "lab"
    active_lease(client, gpus=16, topology={"required": "leaf"})  # the other leaf of "lab"
    other = provider_with_nodes(slug="cheap-provider", nodes=2, fabric="lab2")
    Node.objects.update(state="active")
    prices.set_prices(provider=other, scope={"fabric": "lab2"}, price_micros=1_000_000,
                      actor="t")  # free and cheaper, but no InfiniBand reaches it

    fail(Allocation.objects.filter(lease=lease).first().gpu)

    assert remediation.remediate_leases() == {lease.pk: "degraded"}
    assert set(Allocation.objects.filter(lease=lease).values_list(
        "gpu__node__fabric__name", flat=True)) == {"lab"}


def test_a_repair_stays_in_the_preferred_leaf_although_its_free_gpus_ask_a_minimum_lease(db):
    """The README's rehearsal: the spare GPUs beside the lease are priced with a 4-hour
    minimum; that applies to new leases, not to repairing one, so the lease keeps its leaf."""
    client = setup_market()
    lease = active_lease(client, gpus=8, topology={"preferred": "leaf"})
    gpu = Allocation.objects.filter(lease=lease).first().gpu
    leaf = gpu.node.host.leaf
    provider = gpu.node.provider
    prices.set_prices(provider=provider, scope={"leaf": leaf}, price_micros=2_000_000,
                      min_lease_hours=4, actor="t")

    fail(gpu)

    assert remediation.remediate_leases() == {lease.pk: "moved"}
    assert current_hosts(lease) == {leaf}

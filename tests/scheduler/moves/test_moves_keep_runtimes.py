"""A lease asking its nodes to run something is never moved onto a node whose agent cannot run
it: remediation and draining take replacements from nodes with a fitting runtime only, and
defragmentation plans no move onto another node. Likewise a lease naming no Slurm account is
never moved onto a Slurm node."""

import dataclasses

from django.utils import timezone

from market.models import Allocation, Lease
from pool.models import Binding, Node
from scheduler import placing as scheduler
from scheduler.core.placement.defrag import plan_defrag
from scheduler.moves import defrag, remediation
from tests.scheduler.core.placement.test_defrag import layout, on, where
from tests.scheduler.core.placement.test_defrag import lease as lease_view
from tests.scheduler.moves.test_defrag import layout as market_layout
from tests.scheduler.moves.test_defrag import nodes_of, running_lease
from tests.scheduler.moves.test_remediation import active_lease, fail, setup_market

WORKLOAD = {"command": ["python3", "train.py"]}


def active_workload_lease(client, gpus, topology) -> Lease:
    body = client.post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00", "topology": topology, "workload": WORKLOAD},
        format="json").json()
    lease = Lease.objects.get(pk=body["lease"])
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=lease.created_at)
    scheduler.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def hosts_now(lease) -> set[str]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node__hostname", flat=True))


def test_a_remediated_workload_lease_skips_the_free_node_next_to_it_that_runs_nothing(db):
    client = setup_market()  # two leaves of two 8-GPU nodes, their agents running nothing
    first_leaf, _, other_leaf, _ = Node.objects.order_by("host__leaf", "hostname")
    Node.objects.filter(pk__in=[first_leaf.pk, other_leaf.pk]).update(runtime="process")
    lease = active_workload_lease(client, 8, {"preferred": "leaf"})
    [where_it_was] = hosts_now(lease)
    gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(gpu)

    assert remediation.remediate_leases() == {lease.pk: "moved"}
    # the free node in its own leaf runs nothing: the replacement comes from the other leaf's
    # process node
    process_nodes = {first_leaf.hostname, other_leaf.hostname}
    assert hosts_now(lease) == process_nodes
    assert where_it_was in process_nodes


def test_a_workload_lease_promised_a_leaf_is_degraded_rather_than_moved_onto_a_none_node(db):
    client = setup_market()
    first_leaf = Node.objects.order_by("host__leaf", "hostname").first()
    Node.objects.filter(pk=first_leaf.pk).update(runtime="process")
    lease = active_workload_lease(client, 8, {"required": "leaf"})
    gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(gpu)

    assert remediation.remediate_leases() == {lease.pk: "degraded"}
    assert Node.objects.get(hostname__in=hosts_now(lease)).runtime == "process"


def test_defragmentation_plans_no_move_of_a_workload_lease_onto_a_node_that_runs_nothing():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    # as test_two_half_used_leaves_become_one_full_leaf_and_one_free_leaf, but only the nodes
    # the leases sit on run commands: neither lease may go next to the other
    nodes = [dataclasses.replace(n, runtime="process") if n.name in ("a1", "b1") else n
             for n in nodes]
    runs = frozenset({"process", "ssh"})
    leases = [dataclasses.replace(lease_view(1, on(nodes, "a1", 8)), runtimes=runs),
              dataclasses.replace(lease_view(2, on(nodes, "b1", 8)), runtimes=runs)]

    plan = plan_defrag(nodes, leases)

    assert plan.moves == ()
    assert where(plan, nodes, leases) == {1: {"a1"}, 2: {"b1"}}


def test_a_remediated_lease_without_a_slurm_account_skips_the_free_slurm_node_next_to_it(db):
    client = setup_market()  # two leaves of two 8-GPU nodes
    first_leaf, first_leafs_slurm, other_leaf, other_leafs_slurm = Node.objects.order_by(
        "host__leaf", "hostname")
    Node.objects.filter(pk__in=[first_leafs_slurm.pk, other_leafs_slurm.pk]).update(
        runtime="slurm")
    lease = active_lease(client, gpus=8, topology={"preferred": "leaf"})
    gpu = Allocation.objects.filter(lease=lease).first().gpu

    fail(gpu)

    assert remediation.remediate_leases() == {lease.pk: "moved"}
    # the free node in its own leaf is a Slurm node: the replacement comes from the other leaf
    assert hosts_now(lease) == {first_leaf.hostname, other_leaf.hostname}


def test_defragmentation_moves_a_lease_onto_a_slurm_node_only_when_it_names_an_account(db):
    tenant, (a1, a2, b1, _) = market_layout()
    Node.objects.filter(pk=a2.pk).update(runtime="slurm")
    running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    spot = running_lease(tenant, b1)

    assert defrag.defragment().moves_planned == 0  # a2, next to a1, takes no plain lease
    assert nodes_of(spot) == {b1.pk}

    Lease.objects.filter(pk=spot.pk).update(slurm_account="physics")
    defrag.defragment()

    assert nodes_of(spot) == {a2.pk}

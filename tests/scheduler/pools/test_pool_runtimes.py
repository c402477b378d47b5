"""A pool order asking its nodes to run something goes only on pool nodes whose agent can run
it: refused at intake when the pool has too few such GPUs, and admitted onto them only."""

import pytest

from market import orders
from market.models import Allocation
from market.order_states import OrderError
from pool.models import Node
from tests.factories import make_org
from tests.scheduler.pools.builders import H100, admit, private_pool, queue

WORKLOAD = {"command": ["python3", "train.py"]}


@pytest.fixture
def physics(db):
    return make_org("physics-dept", "tenant")


@pytest.fixture
def campus(physics):
    pool = private_pool(nodes=4)  # 32 GPUs, their agents run nothing
    queue(pool, "physics", physics, nominal=32)
    return pool


def pool_order(org, pool, gpus, **extra):
    return orders.place_order(tenant=org, actor="test", request=orders.OrderRequest(
        gpu_models=[H100], gpus=gpus, hours=4, tier="on_demand", max_price_micros=0,
        pool=pool.name, **extra))


def test_a_pool_order_with_a_workload_in_a_pool_whose_nodes_run_nothing_is_refused(
        campus, physics):
    with pytest.raises(OrderError) as refused:
        pool_order(physics, campus, 8, workload=WORKLOAD)

    assert refused.value.field == "workload"
    assert "has 0 H100-80GB GPUs on nodes that can run it" in refused.value.message
    assert "runtime process or ssh" in refused.value.message


def test_a_pool_order_with_a_workload_is_admitted_onto_the_node_that_runs_commands(
        campus, physics):
    node = Node.objects.order_by("hostname")[3]
    Node.objects.filter(pk=node.pk).update(runtime="process")
    placed = pool_order(physics, campus, 8, workload=WORKLOAD)

    admit(campus)

    placed.refresh_from_db()
    assert placed.state == "filled"
    assert set(Allocation.objects.filter(lease=placed.lease).values_list(
        "gpu__node__hostname", flat=True)) == {node.hostname}


def test_admission_says_when_the_nodes_that_can_run_it_are_taken(campus, physics):
    node = Node.objects.order_by("hostname")[3]
    Node.objects.filter(pk=node.pk).update(runtime="process")
    first = pool_order(physics, campus, 8, workload=WORKLOAD)
    second = pool_order(physics, campus, 8, workload=WORKLOAD)

    report = admit(campus)

    assert report.admitted == [first.pk]
    assert report.waiting[second.pk] == (
        "within quota, but no room to place it: only 0 of 8 GPUs are on nodes that can run "
        "it; a workload needs nodes whose agent runs commands (runtime process or ssh)")


# --- Slurm nodes take only orders that name a Slurm account ----------------------------------

NEEDS_AN_ACCOUNT = ("nodes on a Slurm fabric need a slurm_account on the order (the Slurm "
                    "account their reservation is made for)")


def test_a_pool_order_without_a_slurm_account_in_a_pool_of_slurm_nodes_is_refused_naming_it(
        campus, physics):
    Node.objects.update(runtime="slurm")

    with pytest.raises(OrderError) as refused:
        pool_order(physics, campus, 8)

    assert refused.value.field == "slurm_account"
    assert refused.value.message == (
        f"pool campus has 0 H100-80GB GPUs on nodes that can run it; {NEEDS_AN_ACCOUNT}")


def test_a_pool_order_naming_a_slurm_account_is_admitted_onto_slurm_nodes_and_carries_it(
        campus, physics):
    Node.objects.update(runtime="slurm")
    placed = pool_order(physics, campus, 16, slurm_account="physics")

    admit(campus)

    placed.refresh_from_db()
    assert placed.state == "filled"
    assert placed.slurm_account == placed.lease.slurm_account == "physics"


def test_admission_keeps_pool_orders_without_a_slurm_account_off_slurm_nodes(campus, physics):
    first, second, _, _ = Node.objects.order_by("hostname")
    Node.objects.filter(pk__in=[first.pk, second.pk]).update(runtime="slurm")
    first_order = pool_order(physics, campus, 16)
    second_order = pool_order(physics, campus, 8)

    report = admit(campus)

    assert report.admitted == [first_order.pk]
    first_order.refresh_from_db()
    assert not Allocation.objects.filter(lease=first_order.lease,
                                         gpu__node__runtime="slurm").exists()
    assert report.waiting[second_order.pk] == (
        "within quota, but no room to place it: only 0 of 8 GPUs are on nodes that can run "
        f"it; {NEEDS_AN_ACCOUNT}")

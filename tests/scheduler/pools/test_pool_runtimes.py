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

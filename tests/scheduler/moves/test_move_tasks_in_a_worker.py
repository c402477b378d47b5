"""The drain and defragmentation beats run as tasks in a real Celery worker process."""

import pytest
from django.utils import timezone

from market.models import Allocation, LeaseEvent
from pool import services as pool
from pool.models import Node
from scheduler import tasks
from scheduler.models import DefragRun
from tests.scheduler.moves.test_defrag import layout, running_lease


def nodes_of(lease) -> set[int]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node_id", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_worker_drains_a_node_then_defragments_the_pool(celery_worker_process):
    tenant, (a1, a2, b1, b2) = layout()
    steady = running_lease(tenant, a1, tier="on_demand", allow_moves=False)
    spot = running_lease(tenant, a2)
    pool.drain_node(node=Node.objects.get(pk=a2.pk), actor="operator", mode="move")

    drained = tasks.drain_nodes.delay().get(timeout=60)
    (moved_to,) = nodes_of(spot)
    defragmented = tasks.defragment.delay().get(timeout=60)

    # the spot lease left the drained node (its leaf had no room); the node stays draining
    # until its agent confirms it stopped serving the lease
    assert drained == {"moved": [spot.pk], "waiting": [], "offline": []}
    assert moved_to in {b1.pk, b2.pk} and nodes_of(steady) == {a1.pk}
    assert Node.objects.get(pk=a2.pk).state == "draining"
    # nothing left to gather: one lease a leaf, the other node of leaf B whole and free
    assert defragmented == {"run": DefragRun.objects.get().pk, "moves": 0,
                            "whole_free_leaves": [0, 0], "whole_free_nodes": [1, 1]}
    assert LeaseEvent.objects.filter(lease=spot, kind="moved").count() == 1

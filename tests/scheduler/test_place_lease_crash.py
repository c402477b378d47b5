"""Placement survives its worker dying, and a message delivered twice places once.

Real parts: PostgreSQL, Redis, real `celery worker` processes on a queue of their own (and its
placement partitions). A worker is SIGKILLed while it sits inside the placement transaction
(after every write, before the commit: `tests/scheduler/paused_worker.py`); PostgreSQL rolls the
transaction back, and the broker delivers the unacknowledged message again to the next worker
(`CELERY_VISIBILITY_TIMEOUT_S` and `CELERY_RESTORE_INTERVAL_S` are short for it), which places the lease.
"""

import os
import signal
import time

import pytest
from django.db import DatabaseError, transaction

from billing import services as money
from ibex.celery import app as celery_app
from market import orders, prices
from market.models import Allocation, Lease, LeaseEvent
from pool import services as pool
from pool.models import Binding, Node
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes

DEADLINE_S = 90


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def an_order_filled() -> Lease:
    """A 16-GPU on-demand order filled on two nodes; its placement message is sent on commit."""
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    order = orders.place_order(tenant=tenant, actor="test", request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=16, hours=1, tier="on_demand",
        max_price_micros=2_000_000))
    assert order.state == "filled"
    return order.lease


def lease_row_locked(lease: Lease) -> bool:
    try:
        with transaction.atomic():
            Lease.objects.select_for_update(nowait=True).get(pk=lease.pk)
    except DatabaseError:
        return True
    return False


def acknowledge_on_every_node(lease: Lease) -> None:
    """What each node's agent does: its next heartbeat says it serves the lease."""
    for node in Node.objects.filter(bindings__lease_ref=f"L-{lease.pk}"):
        pool.record_heartbeat(node=node, gpus=[{"index": i} for i in range(8)], ib_ports=[],
                              serving=[f"L-{lease.pk}"])


def assert_placed_once(lease: Lease) -> None:
    lease.refresh_from_db()
    assert lease.state == "active"
    states = list(LeaseEvent.objects.filter(lease=lease, kind="state")
                  .values_list("to_state", flat=True))
    assert states == ["pending", "placing", "active"]  # active exactly once
    assert Allocation.objects.filter(lease=lease).count() == lease.gpu_count == 16
    bindings = list(Binding.objects.filter(lease_ref=f"L-{lease.pk}"))
    assert len(bindings) == 2 and len({b.node_id for b in bindings}) == 2
    assert sorted(i for b in bindings for i in b.gpu_indexes) == sorted(list(range(8)) * 2)


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_placement_leaves_nothing_and_the_next_one_places_once(
        queue, workers):
    pool.ensure_gpu_catalogue()
    doomed = workers(queue, f"{queue}-doomed", module="tests.scheduler.paused_worker")
    lease = an_order_filled()
    wait_for(lambda: lease_row_locked(lease), "the worker to sit inside the placement")

    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    wait_for(lambda: not lease_row_locked(lease), "PostgreSQL to roll the placement back")

    lease.refresh_from_db()
    assert lease.state == "pending"  # nothing half-done: no state change, no binding
    assert not Binding.objects.exists()
    assert not LeaseEvent.objects.filter(lease=lease, to_state="placing").exists()
    workers(queue, f"{queue}-next", CELERY_VISIBILITY_TIMEOUT_S="2",
            CELERY_RESTORE_INTERVAL_S="1")
    wait_for(lambda: Lease.objects.get(pk=lease.pk).state == "placing",
             "the message to be delivered again and placed")
    acknowledge_on_every_node(lease)

    assert_placed_once(lease)


@pytest.mark.django_db(transaction=True)
def test_a_placement_delivered_twice_to_two_workers_places_once(queue, workers):
    pool.ensure_gpu_catalogue()
    workers(queue, f"{queue}-a")
    workers(queue, f"{queue}-b")

    lease = an_order_filled()  # the first delivery, from the outbox
    duplicates = [celery_app.send_task("scheduler.place_lease", args=[lease.pk])
                  for _ in range(2)]  # and two more, taken by both workers

    assert [d.get(timeout=DEADLINE_S) for d in duplicates] == ["placing", "placing"]
    acknowledge_on_every_node(lease)

    assert_placed_once(lease)

"""Builders for private-pool tests: a pool of registered nodes, quota queues, orders placed
through the market's order service, and leases brought to active as the agents would."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from market import leasing, orders
from market.models import Lease, Order
from pool import quotas
from pool.models import Node, Pool
from scheduler.pools import admission
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes

H100 = "H100-80GB"


def private_pool(name="campus", nodes=4, slug="campus-hpc"):
    """A private pool of `nodes` 8-GPU nodes (2 per leaf up to 8 nodes, then 8 per leaf)."""
    provider = provider_with_nodes(slug=slug, nodes=nodes)
    pool = Pool.objects.create(name=name, owner=make_org(f"{name}-ops", "operator"))
    Node.objects.filter(provider=provider).update(state="active")  # heartbeats would
    pool.nodes.set(Node.objects.filter(provider=provider))
    return pool


def queue(pool, name, org=None, nominal=0, borrowing_limit=None, lending_limit=None,
          parent=None, cohort="", preempt_within_queue=False, shape_nodes=None):
    return quotas.define_quota_node(
        pool=pool, name=name, parent=parent, cohort=cohort, organization=org,
        preempt_within_queue=preempt_within_queue, shape_nodes=shape_nodes,
        quotas=[quotas.QuotaSpec(H100, nominal, borrowing_limit, lending_limit)])


def order(org, pool, gpus, queue_name="", priority=0, hours=4, topology=None) -> Order:
    return orders.place_order(tenant=org, actor="test", request=orders.OrderRequest(
        gpu_models=[H100], gpus=gpus, hours=hours, tier="on_demand", max_price_micros=0,
        pool=pool.name, queue=queue_name, priority=priority, topology=topology or {}))


def admit(pool, now=None):
    return admission.admit_pool(pool_id=pool.pk, now=now)


def activate(lease: Lease) -> Lease:
    """Bring a pending lease to active, as binding and the agents' acknowledgements would.
    (Where a live worker runs, as in the browser tests, it may have started placing it.)"""
    for _ in range(5):
        lease.refresh_from_db()
        step = {"pending": ("placing", "binding"), "placing": ("active", "served")}.get(
            lease.state)
        if step is None:
            break
        try:
            leasing.change_lease_state(lease=lease, to_state=step[0], actor="test",
                                       reason=step[1])
        except leasing.LeaseTransitionError:
            continue  # the worker moved it meanwhile: look again
    assert lease.state == "active", lease.state
    return lease


def run(org, pool, *sizes, priority=0, queue_name="") -> list[Lease]:
    """Orders admitted and active now, one lease per size, each a second newer than the last."""
    out = []
    for gpus in sizes:
        placed = order(org, pool, gpus, queue_name=queue_name, priority=priority)
        admit(pool)
        placed.refresh_from_db()
        assert placed.state == "filled", placed.reason
        Lease.objects.filter(pk=placed.lease_id).update(
            created_at=timezone.now() + timedelta(seconds=len(out)))
        out.append(activate(placed.lease))
    return out


def states(leases) -> list[str]:
    return [Lease.objects.get(pk=lease.pk).state for lease in leases]

"""Orders in private pools: priced in quota, not money.

An order that names a private pool goes to one of the tenant's quota queues there (a leaf
`pool.QuotaNode` whose organisation is the tenant). It holds no money: it is *queued* until the
scheduler's admission pass (`scheduler.pools.admission`) admits it under the pool's quotas and
places it; then it is filled by a lease that carries its queue and priority. What a lease
used is accounted in GPU-hours through the same ledger (`market.ledger`): one balanced
transaction per ended lease, in the currency `gph` (micro-GPU-hours), from the pool owner's
`quota_issued` account to the tenant's `quota_used` account. No Stripe, no dollars.

Preemption in private pools (reclaim, priority, tidal schedules) uses the spot mechanism: an
active lease gets `preempt_at` = now + the notice and becomes PREEMPTING; the market's
`end_preempted_leases` beat ends it when the notice runs out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q

from ibex.accounts.models import Organization
from ibex.outbox import services as outbox
from market import leasing
from market.models import Lease, Order
from market.order_states import OS, OrderError, change_order_state
from pool.core.workloads import why_runtimes
from pool.models import Gpu, Pool, PriorityClass, QuotaNode

HOLDING = (Lease.State.PENDING, Lease.State.PLACING, Lease.State.ACTIVE, Lease.State.PREEMPTING)
MAX_PRIORITY = 1000


@dataclass(frozen=True)
class PoolTarget:
    pool: Pool
    queue: QuotaNode
    priority: int = 0
    priority_class: PriorityClass | None = None


def resolve_target(*, tenant: Organization, pool: str, queue: str, gpu_models: list[str],
                   tier: str, max_price_micros: int, gpus: int, priority: int,
                   priority_class: str = "", runtimes: frozenset[str] | None = None,
                   runtimes_field: str = "workload"):
    """The pool and queue an order names, or `market.orders.OrderError` naming the field.
    `runtimes`: the node runtimes that can run what the order asks (None: any), checked
    against the pool's nodes (`runtimes_field` is the input at fault)."""
    found = Pool.objects.filter(name=pool, kind=Pool.Kind.PRIVATE).first()
    queues = QuotaNode.objects.filter(pool=found, organization=tenant, children__isnull=True)
    if found is None or not queues.exists():
        raise OrderError(f"your organisation has no quota in a private pool named {pool!r}",
                         field="pool")
    if queue:
        chosen = queues.filter(name=queue).first()
        if chosen is None:
            raise OrderError(f"your organisation has no quota queue {queue!r} in pool {pool}",
                             field="queue")
    else:
        names = sorted(queues.values_list("name", flat=True))
        if len(names) > 1:
            raise OrderError(f"name one of your queues in pool {pool}: {', '.join(names)}",
                             field="queue")
        chosen = queues.get()
    if len(gpu_models) != 1:
        raise OrderError("an order in a private pool names exactly one GPU model",
                         field="gpu_models")
    if not chosen.quotas.filter(gpu_model__name=gpu_models[0]).exists():
        raise OrderError(f"queue {chosen.name} has no quota for {gpu_models[0]}",
                         field="gpu_models")
    if tier != Lease.Tier.ON_DEMAND:
        raise OrderError("orders in a private pool are on_demand: the quota decides when they "
                         "start", field="tier")
    if max_price_micros != 0:
        raise OrderError("orders in a private pool are priced in quota: give 0.00",
                         field="max_price_per_gpu_hour")
    if not 0 <= priority <= MAX_PRIORITY:
        raise OrderError(f"priority is a whole number from 0 to {MAX_PRIORITY}",
                         field="priority")
    named = None
    if priority_class:
        named = PriorityClass.objects.filter(pool=found, name=priority_class).first()
        if named is None:
            known = sorted(PriorityClass.objects.filter(pool=found).values_list("name", flat=True))
            raise OrderError(f"pool {pool} has no priority class {priority_class!r}"
                             + (f"; it has {', '.join(known)}" if known else ""),
                             field="priority_class")
        if priority and priority != named.value:
            raise OrderError("give a priority or a priority_class, not both",
                             field="priority_class")
        priority = named.value
    # the pool's nodes as their agents report them now: an order they cannot run would only
    # wait in the queue for ever (one query for both counts)
    able = None if runtimes is None else Q(node__runtime__in=sorted(runtimes))
    counted = (Gpu.objects.filter(node__pools=found, gpu_model__name=gpu_models[0])
               .exclude(node__state="retired")
               .aggregate(largest=Count("id"), able=Count("id", filter=able)))
    if gpus > counted["largest"]:
        raise OrderError(f"pool {pool} has {counted['largest']} {gpu_models[0]} GPUs",
                         field="gpus")
    if runtimes is not None and gpus > counted["able"]:
        raise OrderError(f"pool {pool} has {counted['able']} {gpu_models[0]} GPUs on nodes "
                         f"that can run it; {why_runtimes(runtimes)}", field=runtimes_field)
    return PoolTarget(found, chosen, priority, named)


def queue_order(*, order: Order, target: PoolTarget, actor: str) -> Order:
    """A new pool order waits for the next admission pass (queued at once through the outbox)."""
    order.pool, order.quota_node = target.pool, target.queue
    order.priority, order.priority_class = target.priority, target.priority_class
    order.save(update_fields=["pool", "quota_node", "priority", "priority_class"])
    change_order_state(order, OS.QUEUED, actor=actor, reason="waiting for quota admission")
    outbox.enqueue("scheduler.admit_pool", target.pool.pk)
    return order


def fill_pool_order(*, order: Order, gpus: list[leasing.GpuChoice], gpu_model: str,
                    starts_at: datetime, locality: dict, reason: str,
                    actor: str = "scheduler") -> Lease:
    """Admit a queued order: a lease on these GPUs in its queue, placed like market leases."""
    lease = leasing.create_lease(
        tenant=order.tenant, tier=order.tier, gpu_model=gpu_model, gpus=gpus,
        starts_at=starts_at, ends_at=starts_at + timedelta(hours=order.hours), price_micros=0,
        max_price_micros=0, locality=locality, actor=actor,
        reason=f"order {order.pk} admitted by the pool's quota", workload=order.workload,
        ssh_keys=order.ssh_keys, slurm_account=order.slurm_account)
    Lease.objects.filter(pk=lease.pk).update(quota_node=order.quota_node_id,
                                             priority=order.priority)
    lease.quota_node_id, lease.priority = order.quota_node_id, order.priority
    order.lease, order.queue_position = lease, None
    order.save(update_fields=["queue_position"])
    change_order_state(order, OS.FILLED, actor=actor, reason=reason)
    outbox.enqueue("scheduler.place_lease", lease.pk)
    return lease


def set_waiting(*, order_id: int, position: int, reason: str) -> None:
    """Record a queued order's place in its pool's queue and why it waits (if changed)."""
    Order.objects.filter(pk=order_id, state=OS.QUEUED).exclude(
        Q(queue_position=position) & Q(reason=reason[:500])).update(
        queue_position=position, reason=reason[:500])


def pool_leases(pool: Pool):
    """Leases that hold GPUs of a pool's quota now (pending, placing, active, preempting)."""
    return (Lease.objects.filter(quota_node__pool=pool, state__in=HOLDING)
            .select_related("quota_node"))


def pool_usage(pool: Pool) -> list[tuple[str, str, int]]:
    """`(queue, model, gpus)` of every lease that holds GPUs of the pool now, as
    `pool.quotas.usage_of_pool` takes them."""
    return [(lease.quota_node.name, lease.gpu_model, lease.gpu_count)
            for lease in pool_leases(pool)]


def usage_and_waiting(pool: Pool) -> dict:
    """What `pool.usage_port` asks for: the pool's usage and its queued orders, plain."""
    waiting: dict[str, list[dict]] = {}
    for order in (Order.objects.filter(pool=pool, state=OS.QUEUED).select_related("quota_node")
                  .order_by("queue_position", "created_at", "pk")):
        waiting.setdefault(order.quota_node.name, []).append({
            "order": order.pk, "gpus": order.gpus, "priority": order.priority,
            "position": order.queue_position, "reason": order.reason})
    return {"usage": pool_usage(pool), "waiting": waiting}

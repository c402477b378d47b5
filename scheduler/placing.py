"""Placing leases: place a won lease on its nodes, activate it once every node's agent has
acknowledged it through its heartbeat, and sweep placements that stalled (queue them again,
place them again off a silent node, or fail them at the timeout).

Placement (`place_lease`) runs in one transaction under the lease's row lock, so a worker
killed anywhere in it leaves nothing half-done and the next delivery starts afresh:

1. a lease no longer pending was placed already (or ended): nothing to do, so a task
   delivered twice places once;
2. the allocation the market chose is checked against the pool as it is now (every GPU still
   offered: healthy, on an active reachable node of a verified provider); if capacity changed
   since the clearing, the placement engine runs again on the current free GPUs, honouring the
   order's models, topology constraint and price limit, and the allocations are rewritten (the
   exclusion constraint decides a race with another lease: look again, a few times);
3. each node gets its binding and the lease becomes `placing`; the nodes' heartbeats
   acknowledge the bindings, and the last acknowledgement activates the lease
   (`activate_if_acknowledged`, called by the pool; the beat `activate_acknowledged_leases`
   is the safety net).

When no placement exists, `NoPlacement` rolls everything back; the task retries with backoff
and, at its last attempt, fails the lease with the reason (its hold is released: a lease that
never became active costs nothing).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from fabric import services as fabric
from ibex.outbox import services as outbox
from ibex.references import lease_id_of
from market import guarantees, leasing, parts, pool_orders
from market.models import Allocation, Lease, Order
from market.orders import FoundGpus, FreeGpu, find_gpus
from pool import services as pool
from pool.core import quotas as quota_core
from pool.models import Binding
from scheduler import gateway
from scheduler.pools import admission
from scheduler.pools.running import running_of

REPLACEMENT_RACES = 3


class NoPlacement(Exception):
    """The lease cannot be placed on the pool as it is now; the message says why."""


def lease_exists(*, lease_id: int) -> bool:
    return Lease.objects.filter(pk=lease_id).exists()


def place_lease(*, lease_id: int, final: bool = True) -> Lease:
    """Place a pending lease on its nodes; delivered twice, it places once.

    Raises NoPlacement (having changed nothing) when the lease fits nowhere and this is not
    the `final` attempt; at the final attempt the lease fails instead, its hold released.
    """
    with transaction.atomic():
        lease = Lease.objects.select_for_update().filter(pk=lease_id).first()
        if lease is None:
            raise NoPlacement(f"there is no lease {lease_id}")
        if lease.state != Lease.State.PENDING:
            return lease
        try:
            with transaction.atomic():
                lease, moved = _valid_allocation(lease)
        except NoPlacement as exc:
            if not final:
                raise
            return leasing.change_lease_state(
                lease=lease, to_state=Lease.State.FAILED, actor="scheduler",
                reason=f"could not be placed: {exc}"[:500])
        try:
            with transaction.atomic():
                placed = leasing.change_lease_state(
                    lease=lease, to_state=Lease.State.PLACING, actor="scheduler",
                    reason="re-placed and bound to its nodes" if moved else "bound to its nodes")
                indexes, node_parts = parts.bindings_of(Allocation.objects.filter(lease=placed))
                # binding gives a lease on several nodes its partition (a P_Key of the fabric)
                pool.set_lease_bindings(wanted={placed.reference: indexes},
                                        launches={placed.reference: launch_of(placed)},
                                        parts={placed.reference: node_parts},
                                        classes=leasing.bandwidth_classes_of([placed]))
                return placed
        except fabric.PartitionsExhausted as exc:
            if not final:
                raise NoPlacement(str(exc)) from None
            return leasing.change_lease_state(
                lease=lease, to_state=Lease.State.FAILED, actor="scheduler",
                reason=f"could not be placed: {exc}"[:500])


def launch_of(lease: Lease) -> dict | None:
    """What the lease's nodes run (docs/workloads.md): its workload and SSH keys, or None."""
    if not lease.workload and not lease.ssh_keys:
        return None
    workload = lease.workload or {}
    return {"command": workload.get("command"), "env": workload.get("env") or {},
            "workdir": workload.get("workdir") or "", "ssh_keys": list(lease.ssh_keys)}


def _valid_allocation(lease: Lease) -> tuple[Lease, bool]:
    """The lease with allocations that are valid now, and whether they had to move: every GPU
    still offered and, for a guaranteed lease, its guarantee within every link's share on the
    routes between its nodes (docs/fabric.md, "Admission on the real routes")."""
    held = list(Allocation.objects.filter(lease=lease).values_list("gpu_id", flat=True))
    offered = set(pool.offered_gpus().filter(pk__in=held).values_list("pk", flat=True))
    order = Order.objects.filter(lease=lease).first()
    lost = len(set(held) - offered) + max(lease.gpu_count - len(held), 0)
    problem = f"{lost} of its GPUs are no longer offered"
    moved_why = f"{lost} of GPUs {sorted(held)} no longer offered"
    if not lost:
        verdict = guarantee_verdict(lease, order)
        if verdict is None or verdict.ok:
            return lease, False
        problem = moved_why = guarantees.refusal_text(verdict)
    if order is None:
        raise NoPlacement(f"{problem if not lost else 'its GPUs are no longer offered'} and it "
                          "has no order to re-place")
    reason = ""
    for _race in range(REPLACEMENT_RACES):
        # Its own GPUs count as free again: the engine may keep the ones still offered.
        Allocation.objects.filter(lease=lease).delete()
        # from now on: a GPU another lease held until a moment ago is free for it
        start = max(lease.starts_at, timezone.now())
        found = (_find_in_pool(order, start, lease.ends_at) if order.pool_id
                 else find_gpus(order, start, lease.ends_at,
                                avoid_nodes=gateway.avoided_nodes(lease.pk)))
        if isinstance(found, str):
            raise NoPlacement(f"{problem} and {found}")
        try:
            with transaction.atomic():
                lease = leasing.replace_allocations(
                    lease=lease, gpus=found.choices(), gpu_model=found.gpu_model,
                    locality=found.locality(),
                    price_micros=found.price_micros(order.max_price_micros), starts_at=start,
                    reason=moved_why[:500])
            return lease, True
        except leasing.GpusUnavailable as exc:
            reason = str(exc)  # another lease won one of them: look again
    raise NoPlacement(f"{problem} and {reason}")


def guarantee_verdict(lease: Lease, order: Order | None):
    """Whether a guaranteed lease's GPUs keep its guarantee beside every other one on the
    routes between its nodes (None: it guarantees nothing)."""
    if not guarantees.is_guaranteed(order):
        return None
    gpus: dict[tuple[str, str], list[int]] = {}
    for fabric_name, host, index in Allocation.objects.filter(lease=lease).values_list(
            "gpu__node__fabric__name", "gpu__node__hostname", "gpu__index"):
        gpus.setdefault((fabric_name, host), []).append(index)
    start = max(lease.starts_at, timezone.now())
    return guarantees.verdict_of(gpus, float(order.gbps_per_gpu), {}, start, lease.ends_at,
                                 reference=lease.reference, exclude=[lease.pk])


def _find_in_pool(order: Order, start: datetime, end: datetime) -> FoundGpus | str:
    """A private-pool lease is re-placed on its own pool's free GPUs only (the market's
    `find_gpus` sells no private GPUs), keeping the other queues' shaped guarantees placeable
    as the admission pass does (`scheduler.pools.admission.PoolPlacer`)."""
    usage = quota_core.usage_of(running_of(pool_orders.pool_leases(order.pool)))
    placer = admission.PoolPlacer(order.pool, start, end,
                                  admission.shapes_of(order.pool, usage))
    chosen, why = placer.place(order)
    if chosen is None:
        return f"no room in pool {order.pool.name}: {why}"
    model = order.gpu_models[0]
    # a guaranteed order's placement is admitted on the routes by the placer
    return FoundGpus(chosen=[(key, FreeGpu(gpu_id=gpu_id, index=0, price_micros=0))
                             for key, gpu_id in chosen], gpu_model=model)


def _activate(lease_id: int) -> bool:
    """Activate one placing lease when every node serving it has acknowledged it."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update().filter(
            pk=lease_id, state=Lease.State.PLACING).first()
        if lease is None:
            return False  # not placed yet, or activated / ended meanwhile
        bindings = Binding.objects.filter(lease_ref=lease.reference, serve=True)
        if not bindings.exists() or bindings.filter(acknowledged_at__isnull=True).exists():
            return False
        leasing.change_lease_state(lease=lease, to_state=Lease.State.ACTIVE,
                                   actor="scheduler", reason="every node serves it")
        return True


def activate_if_acknowledged(*, lease_refs: list[str]) -> list[int]:
    """Called by the pool when a heartbeat acknowledges bindings: the last acknowledgement of a
    lease activates it at once (each check follows the acknowledgement's commit, so of two
    nodes acknowledging together the later one sees both)."""
    ids = [i for i in map(lease_id_of, lease_refs) if i is not None]
    return [i for i in ids if _activate(i)]


def activate_on_acknowledgement(lease_refs: list[str]) -> list[int]:
    """The pool's acknowledgement listener (registered in scheduler/apps.py)."""
    return activate_if_acknowledged(lease_refs=lease_refs)


def activate_acknowledged_leases() -> list[int]:
    """Leases whose every node has acknowledged its binding become active (the beat's safety
    net for `activate_if_acknowledged`)."""
    placing = Lease.objects.filter(state=Lease.State.PLACING).values_list("pk", flat=True)
    return [lease_id for lease_id in list(placing) if _activate(lease_id)]


def requeue_unplaced_leases(*, now: datetime | None = None) -> list[int]:
    """Pending leases older than PLACEMENT_REQUEUE_S: their placement message was lost (a
    worker killed before it acknowledged, with the broker's redelivery still far off);
    returns their ids for the caller to queue again (placement is idempotent)."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.PLACEMENT_REQUEUE_S)
    # ... and leases won for a later start whose start has come (nothing queued them yet)
    lost_or_due = Q(state_changed_at__lt=cutoff) | Q(starts_at__gt=F("state_changed_at"))
    return list(Lease.objects.filter(lost_or_due, state=Lease.State.PENDING, starts_at__lte=now)
                .order_by("pk").values_list("pk", flat=True)[:1000])


def replace_unacknowledged_leases(*, now: datetime | None = None) -> list[int]:
    """Leases whose node has not acknowledged them within two heartbeat intervals go back to
    pending, off every node, and are placed again (the silent node is no longer offered),
    at most PLACEMENT_ATTEMPTS times; after that `fail_stuck_leases` fails them at its
    timeout."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=2 * settings.NODE_HEARTBEAT_INTERVAL_S)
    late_ids = Lease.objects.filter(state=Lease.State.PLACING, state_changed_at__lt=cutoff
                                    ).values_list("pk", flat=True)
    replaced = []
    for lease_id in late_ids:
        with transaction.atomic():
            lease = Lease.objects.select_for_update(skip_locked=True).filter(
                pk=lease_id, state=Lease.State.PLACING).first()
            if lease is None:
                continue
            ref = lease.reference
            bindings = list(Binding.objects.filter(lease_ref=ref, serve=True)
                            .select_related("node"))
            silent = sorted(b.node.hostname for b in bindings if b.acknowledged_at is None)
            tries = lease.events.filter(kind="state", from_state=Lease.State.PLACING,
                                        to_state=Lease.State.PENDING).count()
            if not silent or tries >= settings.PLACEMENT_ATTEMPTS:
                continue
            for binding in bindings:
                pool.unbind_lease(node=binding.node, lease_ref=ref)
            Allocation.objects.filter(lease=lease, gpu__node__hostname__in=silent).delete()
            leasing.change_lease_state(
                lease=lease, to_state=Lease.State.PENDING, actor="scheduler",
                reason=f"no acknowledgement from {', '.join(silent)} within "
                       f"{2 * settings.NODE_HEARTBEAT_INTERVAL_S} s: placed again")
            outbox.enqueue("scheduler.place_lease", lease.pk)
            replaced.append(lease_id)
    return replaced


def fail_stuck_leases(*, now: datetime | None = None) -> list[int]:
    """Leases still being placed after the timeout fail, with their hold released (the
    tenant pays nothing for a lease that never became active) and a reason."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.PLACING_TIMEOUT_S)
    failed = []
    # A reserved lease won for a later start is not late before it starts.
    stuck = Lease.objects.filter(state__in=[Lease.State.PENDING, Lease.State.PLACING],
                                 state_changed_at__lt=cutoff, starts_at__lt=cutoff
                                 ).values_list("pk", flat=True)
    for lease_id in stuck:
        with transaction.atomic():
            lease = Lease.objects.select_for_update(skip_locked=True).filter(
                pk=lease_id, state__in=[Lease.State.PENDING, Lease.State.PLACING]).first()
            if lease is None:
                continue
            waiting = list(Binding.objects.filter(lease_ref=lease.reference, serve=True,
                                                  acknowledged_at__isnull=True)
                           .values_list("node__hostname", flat=True))
            reason = (f"not active after {settings.PLACING_TIMEOUT_S} s: no acknowledgement "
                      f"from {', '.join(sorted(waiting))}" if waiting else
                      f"not placed within {settings.PLACING_TIMEOUT_S} s")
            leasing.change_lease_state(lease=lease, to_state=Lease.State.FAILED,
                                       actor="scheduler", reason=reason)
            failed.append(lease_id)
    return failed

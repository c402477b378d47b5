"""Events for tenants about their leases, each stored exactly once.

They are derived, never written by the market: a beat (`sync_events`, every 10 s) turns
lease state changes (`LeaseEvent`) and health events on a lease's GPUs into `Event` rows, and
`scheduler.sla` records a `lease.credited` event with each credit. (lease, source) is unique,
so a source becomes one event whatever runs overlap. Once committed, new events are fanned out
to the tenant's webhook endpoints (`notify.webhooks`).

| source                                    | event                     |
| ----------------------------------------- | ------------------------- |
| lease → active                            | lease.started             |
| lease → preempting                        | lease.preemption_notice   |
| lease → preempted                         | lease.preempted           |
| lease → completed / terminated / failed   | lease.ended               |
| LeaseEvent of kind `moved` (migration)    | lease.moved               |
| a GPU of an active lease degraded/failed, | lease.degraded            |
|   or its node unreachable                 |                           |
| a faulty link on a live lease's path      | lease.degraded            |
|   (scheduler/link_health.py records it)   |                           |
| an SLA credit                             | lease.credited            |
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import CharField, Exists, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone

from market.models import Allocation, Lease, LeaseEvent
from notify.models import Event
from pool.models import HealthEvent

K = Event.Kind
STATE_EVENTS = {
    Lease.State.ACTIVE: K.STARTED,
    Lease.State.PREEMPTING: K.PREEMPTION_NOTICE,
    Lease.State.PREEMPTED: K.PREEMPTED,
    Lease.State.COMPLETED: K.ENDED,
    Lease.State.TERMINATED: K.ENDED,
    Lease.State.FAILED: K.ENDED,
}
LOOK_BACK = timedelta(days=1)


# Queues the fan-out of new events to webhooks. The Celery task that does it lives in
# `notify.tasks`, which imports this module, so the app hands it in when Django starts
# (`notify/apps.py`) instead of this module importing it back.
_queue_fan_out: Callable[[], object] | None = None


def on_events_recorded(queue_fan_out: Callable[[], object]) -> None:
    global _queue_fan_out
    _queue_fan_out = queue_fan_out


def _fan_out_after_commit() -> None:
    if _queue_fan_out is None:
        raise RuntimeError("nothing fans events out: is the notify app installed?")
    transaction.on_commit(_queue_fan_out)


def record_event(*, lease: Lease, kind: str, source: str, occurred_at: datetime,
                 payload: dict) -> Event | None:
    """Store one event once per (lease, source); None when it was stored before."""
    try:
        with transaction.atomic():
            event = Event.objects.create(tenant_id=lease.tenant_id, lease=lease, kind=kind,
                                         source=source, occurred_at=occurred_at, payload=payload)
    except IntegrityError:
        return None
    _fan_out_after_commit()
    return event


def _lease_event_kind(row: LeaseEvent) -> str | None:
    if row.kind == "moved":
        return K.MOVED
    if row.kind == "state":
        return STATE_EVENTS.get(row.to_state)
    return None


def sync_lease_events(*, now: datetime | None = None) -> list[Event]:
    """Lease state changes of the last day that have no event yet → events."""
    now = now or timezone.now()
    relevant = Q(kind="state", to_state__in=list(STATE_EVENTS)) | Q(kind="moved")
    stored = Event.objects.filter(lease=OuterRef("lease"),
                                  source=OuterRef("source_key"))
    rows = (LeaseEvent.objects.filter(relevant, at__gte=now - LOOK_BACK)
            .annotate(source_key=Concat(Value("lease_event:"), Cast("id", CharField())))
            .exclude(Exists(stored)).select_related("lease").order_by("at", "id"))
    created = []
    for row in rows:
        kind = _lease_event_kind(row)
        if kind is None:
            continue
        event = record_event(lease=row.lease, kind=kind, source=f"lease_event:{row.pk}",
                             occurred_at=row.at, payload={
                                 "lease": row.lease_id, "from_state": row.from_state,
                                 "to_state": row.to_state, "reason": row.reason,
                                 "actor": row.actor, "at": row.at.isoformat(),
                                 **({"preempt_at": row.lease.preempt_at.isoformat()}
                                    if kind == K.PREEMPTION_NOTICE and row.lease.preempt_at
                                    else {})})
        if event is not None:
            created.append(event)
    return created


def sync_health_events(*, now: datetime | None = None) -> list[Event]:
    """A GPU of a running lease degraded or failed, or its node unreachable → lease.degraded."""
    now = now or timezone.now()
    created = []
    rows = (HealthEvent.objects.filter(at__gte=now - LOOK_BACK, at__lte=now)
            .filter(Q(kind=HealthEvent.Kind.NODE_UNREACHABLE)
                    | Q(kind=HealthEvent.Kind.GPU_HEALTH, to_value__in=["degraded", "failed"]))
            .select_related("node", "gpu").order_by("at", "id"))
    for health in rows:
        allocations = Allocation.objects.filter(
            period__contains=health.at,
            lease__state__in=[Lease.State.ACTIVE, Lease.State.PREEMPTING])
        allocations = (allocations.filter(gpu=health.gpu) if health.gpu_id
                       else allocations.filter(gpu__node=health.node))
        gpus_by_lease: dict[int, list[int]] = {}
        for lease_id, index in allocations.values_list("lease_id", "gpu__index"):
            gpus_by_lease.setdefault(lease_id, []).append(index)
        for lease in Lease.objects.filter(pk__in=list(gpus_by_lease)).order_by("pk"):
            event = record_event(
                lease=lease, kind=K.DEGRADED, source=f"health_event:{health.pk}",
                occurred_at=health.at, payload={
                    "lease": lease.pk, "node": health.node.hostname,
                    "gpus": sorted(gpus_by_lease[lease.pk]), "what": health.kind,
                    "from": health.from_value, "to": health.to_value, "detail": health.detail,
                    "at": health.at.isoformat()})
            if event is not None:
                created.append(event)
    return created


def sync_events(*, now: datetime | None = None) -> int:
    now = now or timezone.now()
    return len(sync_lease_events(now=now)) + len(sync_health_events(now=now))

"""Guarantees checked again when the fabric changes (docs/fabric.md, "Admission on the real
routes"): after a fabric agent's report changes the routes or takes a link down, every active
guaranteed lease of that fabric is admitted again, oldest first, on the routes as they are now.
One whose guarantee no longer holds is moved (`scheduler.moves.one_lease.move_off`, the
remediation's move) onto GPUs where it holds, or, where nothing can take it, left where it is
with a `bandwidth_broken` event naming the link: from then until a later re-check finds it
holding again (`bandwidth_restored`), its GPUs count as down for its SLA (scheduler.sla).

The fabric app cannot call up here: its report enqueues `scheduler.recheck_guarantees` through
the outbox, and a beat runs it for every fabric as a safety net.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fabric.core import admission
from fabric.models import Fabric
from fabric.selectors import admission_routes, links_down_lately
from ibex.outbox import services as outbox
from market import guarantees, leasing
from market.models import Lease, LeaseEvent
from scheduler.moves.free_gpus import FreeIndex
from scheduler.moves.one_lease import choose, held_now, lock_active, rebind

log = logging.getLogger(__name__)

BROKEN, RESTORED = "bandwidth_broken", "bandwidth_restored"
INSTANT = timedelta(seconds=1)  # the window a re-check reads guarantees over: now


def enqueue_recheck(fabric_id: int) -> None:
    """Registered with the fabric app: its report's transaction enqueues the re-check (the
    outbox sends it once the report commits)."""
    outbox.enqueue("scheduler.recheck_guarantees", fabric_id)


def recheck_guarantees(*, fabric_id: int | None = None, now: datetime | None = None
                       ) -> dict[int, str]:
    """Lease id -> "moved", "degraded" or "restored" for each lease whose standing changed."""
    now = now or timezone.now()
    fabrics = Fabric.objects.filter(pk=fabric_id) if fabric_id else Fabric.objects.all()
    outcome: dict[int, str] = {}
    for fabric in fabrics:
        outcome.update(_recheck_fabric(fabric, now))
    return outcome


def _recheck_fabric(fabric: Fabric, now: datetime) -> dict[int, str]:
    held = guarantees.live_guarantees(fabric, now, now + INSTANT)
    if not held:
        return {}
    failed = admission.recheck(admission_routes(fabric), held, float(fabric.guarantee_ratio))
    standing = last_bandwidth_events([lease_id_of(g) for g in held])
    if not failed and BROKEN not in standing.values():
        return {}
    down = links_down_lately(fabric)
    after = f" (links down: {', '.join(down)})" if down else ""
    outcome: dict[int, str] = {}
    for guarantee in held:
        lease_id = lease_id_of(guarantee)
        verdict = failed.get(guarantee.reference)
        if verdict is not None:
            done = _move_or_degrade(lease_id, verdict, standing.get(lease_id), after, now)
            if done != "skipped":  # not active (yet): its placement checks it
                outcome[lease_id] = done
        elif standing.get(lease_id) == BROKEN:
            _note(lease_id, RESTORED, "its guaranteed bandwidth holds again on the routes")
            outcome[lease_id] = "restored"
    return outcome


def last_bandwidth_events(lease_ids: list[int]) -> dict[int, str]:
    """Each lease's last bandwidth event (`bandwidth_broken` or `bandwidth_restored`)."""
    last: dict[int, str] = {}
    for lease_id, kind in LeaseEvent.objects.filter(
            lease_id__in=lease_ids, kind__in=(BROKEN, RESTORED)) \
            .order_by("at", "id").values_list("lease_id", "kind"):
        last[lease_id] = kind
    return last


def lease_id_of(guarantee: admission.Guarantee) -> int:
    return int(guarantee.reference.removeprefix("L-"))


def _move_or_degrade(lease_id: int, verdict: admission.Verdict, standing: str | None,
                     after: str, now: datetime) -> str:
    why = f"its guaranteed bandwidth no longer holds: {verdict.reason}{after}"
    with transaction.atomic():
        lease = lock_active(lease_id)
        if lease is None:
            return "skipped"
        if _move(lease, why, now):
            if standing == BROKEN:
                _note(lease_id, RESTORED, "moved where its guaranteed bandwidth holds")
            return "moved"
        if standing != BROKEN:
            _note(lease_id, BROKEN, f"{why}; nothing can take it: credited under its SLA")
    return "degraded"


def _move(lease: Lease, why: str, now: datetime) -> bool:
    """Move the lease, one node's GPUs at a time and then all of them, onto GPUs where its
    guarantee holds (checked before moving); False when no such move exists."""
    held = held_now(lease, now)
    order = lease.order
    nodes = sorted({h.host for h in held})
    attempts = [{h.gpu_id for h in held if h.host == node} for node in nodes]
    attempts.append({h.gpu_id for h in held})
    index = FreeIndex.build(now)
    for leaving in attempts:
        chosen = choose(lease, held, leaving, index)
        if chosen is None:
            continue
        placement: dict[tuple[str, str], list[int]] = {}
        for node, gpu_index in [((h.fabric, h.host), h.index) for h in held
                                if h.gpu_id not in leaving] + \
                [((s.fabric, s.host), s.index) for s in chosen]:
            placement.setdefault(node, []).append(gpu_index)
        verdict = guarantees.verdict_of(placement, float(order.gbps_per_gpu), {}, now,
                                        lease.ends_at, reference=lease.reference,
                                        exclude=[lease.pk])
        if not verdict.ok:
            index.taken.difference_update(s.gpu_id for s in chosen)
            continue
        try:
            with transaction.atomic():
                leasing.move_gpus(lease=lease, away_from=sorted(leaving), reason=why,
                                  onto=[leasing.GpuChoice(s.gpu_id, s.price_micros)
                                        for s in chosen])
        except leasing.GpusUnavailable:
            continue
        rebind(lease)
        return True
    return False


def _note(lease_id: int, kind: str, reason: str) -> None:
    LeaseEvent.objects.create(lease_id=lease_id, kind=kind, actor="scheduler",
                              reason=reason[:500])

"""Faulty links on live leases' paths: the analogue of a failed GPU for the fabric.

The fabric records when a link is faulty (`fabric.models.LinkFault`: down, or erring above the
provider's threshold) from its agent's reports; it knows no leases. Every 15 s this pass (a
beat) finds the live leases whose path crosses a faulty link and tells each once: a
`LeaseLinkNotice` (unique per lease and fault), a lease event naming the link
(`link_down` / `link_errors`) and the tenant's `lease.degraded` event. When the link is well
again the notice closes and a `link_restored` event says so.

While a notice is open the SLA counts the lease's GPUs on the hosts the link serves as down
(`scheduler/sla.py`), so the lease is credited like one on a failed GPU; remediation moves a
lease off a host the fabric cut off (every HCA cable down: `fabric.selectors.cut_off_hosts`).

A lease's path: the HCA cables of the hosts it holds GPUs on now (`hosts_behind`).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from fabric import selectors as fabric_selectors
from fabric.models import Host, LinkFault
from market.models import Allocation, Lease, LeaseEvent
from notify import events
from notify.models import Event
from scheduler.models import LeaseLinkNotice

LIVE_STATES = (Lease.State.ACTIVE, Lease.State.PREEMPTING)
ACTOR = "fabric"


def hosts_behind(link_ids) -> dict[int, set[int]]:
    """link id → the hosts whose traffic crosses it: a host's own HCA cables."""
    behind: dict[int, set[int]] = defaultdict(set)
    for link_id, host_id in fabric_selectors.hca_links_of_links(link_ids):
        behind[link_id].add(host_id)
    return behind


def watch_links(*, now: datetime | None = None) -> dict[str, int]:
    """Tell live leases of faulty links on their path, and of links back to health. Safe to
    run twice at once: a notice is unique per lease and fault, and closes with a conditional
    UPDATE."""
    now = now or timezone.now()
    told = _tell_faults(now)
    restored = _tell_restored(now)
    return {"told": told, "restored": restored}


def _tell_faults(now: datetime) -> int:
    faults = list(LinkFault.objects.filter(ended_at__isnull=True).order_by("started_at", "id"))
    if not faults:
        return 0
    behind = hosts_behind({fault.link_id for fault in faults})
    hosts = {host for found in behind.values() for host in found}
    if not hosts:
        return 0
    on_hosts: dict[int, set[int]] = defaultdict(set)
    for lease_id, host_id in Allocation.objects.filter(
            lease__state__in=LIVE_STATES, period__contains=now,
            gpu__node__host_id__in=hosts).values_list("lease_id", "gpu__node__host_id").distinct():
        on_hosts[lease_id].add(host_id)
    known = set(LeaseLinkNotice.objects.filter(fault__in=faults).values_list("lease_id",
                                                                             "fault_id"))
    leases = Lease.objects.in_bulk(list(on_hosts))
    names = dict(Host.objects.filter(pk__in=hosts).values_list("pk", "name"))
    told = 0
    for fault in faults:
        for lease_id, lease_hosts in sorted(on_hosts.items()):
            touched = sorted(lease_hosts & behind.get(fault.link_id, set()))
            if not touched or (lease_id, fault.pk) in known:
                continue
            if _tell(leases[lease_id], fault, touched, [names[h] for h in touched]):
                told += 1
    return told


def _tell(lease: Lease, fault: LinkFault, host_ids: list[int], host_names: list[str]) -> bool:
    what = "is down" if fault.kind == LinkFault.Kind.DOWN else f"errs: {fault.detail}"
    reason = (f"link {fault.name} {what} since {fault.started_at:%Y-%m-%d %H:%M:%S} UTC, on the "
              f"lease's path (hosts {', '.join(host_names)}): counted down under its SLA")
    try:
        with transaction.atomic():
            notice = LeaseLinkNotice.objects.create(
                lease=lease, fault=fault, link_name=fault.name, kind=fault.kind,
                detail=fault.detail, host_ids=host_ids, started_at=fault.started_at)
            event = LeaseEvent.objects.create(lease=lease, kind=f"link_{fault.kind}",
                                              actor=ACTOR, reason=reason[:500])
            events.record_event(
                lease=lease, kind=Event.Kind.DEGRADED, source=f"link_notice:{notice.pk}",
                occurred_at=fault.started_at, payload={
                    "lease": lease.pk, "link": fault.name, "fault": fault.kind,
                    "detail": fault.detail, "hosts": host_names, "event": event.pk})
    except IntegrityError:  # told meanwhile by an overlapping pass
        return False
    return True


def _tell_restored(now: datetime) -> int:
    """Close the notices whose fault ended (or is gone: the fabric was re-imported)."""
    restored = 0
    for notice in LeaseLinkNotice.objects.filter(ended_at__isnull=True).select_related(
            "fault", "lease").order_by("pk"):
        fault = notice.fault
        if fault is not None and fault.ended_at is None:
            continue
        ended = fault.ended_at if fault is not None else now
        with transaction.atomic():
            if not LeaseLinkNotice.objects.filter(pk=notice.pk, ended_at__isnull=True) \
                    .update(ended_at=ended):
                continue  # closed meanwhile by an overlapping pass
            what = "is back" if fault is not None else "is no longer known (re-imported)"
            LeaseEvent.objects.create(
                lease=notice.lease, kind="link_restored", actor=ACTOR,
                reason=(f"link {notice.link_name} {what} at {ended:%Y-%m-%d %H:%M:%S} UTC "
                        f"({notice.kind} for {int((ended - notice.started_at).total_seconds())}"
                        " s)")[:500])
        restored += 1
    return restored

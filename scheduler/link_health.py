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

A lease's path: the HCA cables of the hosts it holds GPUs on now (`hosts_behind`) and, where
the fabric agent has sent the switches' forwarding tables (`fabric.selectors.route_map`), the
links of the routes of a ring over those hosts in name order (`ring_crosses`): a switch link
on them serves all the lease's hosts on that fabric (a collective waits for its slowest hop).
When OpenSM routes around a switch link that is still faulty, the lease's notice closes
(`rerouted`) once the routes the agent reports no longer cross it. A lease on one host has no
path: its GPUs talk over NVLink and PCIe, never over a cable; on a host of several rails, an
HCA cable is on the path of the leases with a GPU on its rail.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from fabric import selectors as fabric_selectors
from fabric.core.hostlist import natural_sorted
from fabric.core.partitions import rails_of_gpus
from fabric.core.routes import RouteBroken, RouteMap
from fabric.models import Fabric, Host, LinkFault, Port
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


def ring_crosses(route: RouteMap, hosts: list[str], ports: set[tuple[str, int]]) -> bool:
    """Whether the routes of a ring over `hosts` cross a link with one of `ports` (either
    direction); a route the tables lead over a link that is down crosses it there."""
    for source, destination in route.ring(hosts):
        try:
            hops = route.path(source, destination)
        except RouteBroken as broken:
            if broken.at in ports:
                return True
            continue
        if ports.intersection(hops):
            return True
    return False


class Routes:
    """Each fabric's routes (None without) and the leases' hosts on it, read once a pass."""

    def __init__(self, now: datetime):
        self.now = now
        self._routes: dict[int, RouteMap | None] = {}
        self._hosts: dict[int, dict[int, dict[int, str]]] = {}
        self.read_at: dict[int, datetime] = {}  # the poll whose routes were read (agent clock)

    def route(self, fabric_id: int) -> RouteMap | None:
        if fabric_id not in self._routes:
            fabric = Fabric.objects.get(pk=fabric_id)
            self._routes[fabric_id] = fabric_selectors.route_map(fabric)
            self.read_at[fabric_id] = fabric.live_seen_at or self.now
        return self._routes[fabric_id]

    def leases_on(self, fabric_id: int) -> dict[int, dict[int, str]]:
        """Live lease id → its hosts on the fabric now (host id → name)."""
        if fabric_id not in self._hosts:
            found: dict[int, dict[int, str]] = defaultdict(dict)
            for lease_id, host_id, name in Allocation.objects.filter(
                    lease__state__in=LIVE_STATES, period__contains=self.now,
                    gpu__node__host__fabric_id=fabric_id).values_list(
                    "lease_id", "gpu__node__host_id", "gpu__node__host__name").distinct():
                found[lease_id][host_id] = name
            self._hosts[fabric_id] = found
        return self._hosts[fabric_id]

    def crossing(self, fabric_id: int, ports: set[tuple[str, int]]) -> dict[int, list[int]]:
        """Live leases whose ring over their hosts on the fabric crosses the link: lease id →
        all its hosts there."""
        route = self.route(fabric_id)
        if route is None:
            return {}
        return {lease_id: sorted(hosts) for lease_id, hosts in self.leases_on(fabric_id).items()
                if len(hosts) > 1
                and ring_crosses(route, natural_sorted(hosts.values()), ports)}


def _link_ports(link_ids) -> dict[int, set[tuple[str, int]]]:
    ports: dict[int, set[tuple[str, int]]] = defaultdict(set)
    for link_id, guid, number in Port.objects.filter(link_id__in=list(link_ids)).values_list(
            "link_id", "device_guid", "number"):
        ports[link_id].add((guid, number))
    return ports


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
    cables = fabric_selectors.hca_cable_rails({fault.link_id for fault in faults})
    hosts = {host for host, _rail, _hcas in cables.values()}
    # lease -> host -> the rails its GPUs there use (NCCL_IB_HCA's rule)
    on_hosts: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    if hosts:
        hcas_of = {host: hcas for host, _rail, hcas in cables.values()}
        for lease_id, host_id, index, gpus in Allocation.objects.filter(
                lease__state__in=LIVE_STATES, period__contains=now,
                gpu__node__host_id__in=hosts).values_list(
                "lease_id", "gpu__node__host_id", "gpu__index", "gpu__node__host__gpus"):
            on_hosts[lease_id][host_id].update(
                rails_of_gpus([index], hcas_of[host_id], gpus) or (0,))
    # a lease on one host sends nothing over the fabric: its host's cables are not its path
    several = _on_several_hosts(list(on_hosts), now)
    touched: dict[tuple[int, int], list[int]] = {}  # (fault, lease) -> the hosts it serves
    for fault in faults:
        if fault.link_id not in cables:
            continue
        host, rail, hcas = cables[fault.link_id]
        for lease_id, rails_by_host in on_hosts.items():
            # on a host of several rails, only the leases with a GPU on the cable's rail
            if lease_id in several and host in rails_by_host and (
                    hcas <= 1 or rail in rails_by_host[host]):
                touched[(fault.pk, lease_id)] = [host]
    # switch links: the leases whose routes cross them, where the fabric has routes
    switch_faults = [fault for fault in faults if fault.link_id not in cables]
    if switch_faults:
        routes, ports = Routes(now), _link_ports({f.link_id for f in switch_faults})
        for fault in switch_faults:
            for lease_id, lease_hosts in routes.crossing(fault.fabric_id,
                                                         ports[fault.link_id]).items():
                touched[(fault.pk, lease_id)] = lease_hosts
    if not touched:
        return 0
    known = set(LeaseLinkNotice.objects.filter(fault__in=faults).values_list("fault_id",
                                                                             "lease_id"))
    leases = Lease.objects.in_bulk({lease_id for _, lease_id in touched})
    names = dict(Host.objects.filter(pk__in={h for found in touched.values() for h in found})
                 .values_list("pk", "name"))
    by_id = {fault.pk: fault for fault in faults}
    told = 0
    for (fault_id, lease_id), found in sorted(touched.items()):
        if (fault_id, lease_id) in known:
            continue
        if _tell(leases[lease_id], by_id[fault_id], found, [names[h] for h in found]):
            told += 1
    return told


def _on_several_hosts(lease_ids: list[int], now: datetime) -> set[int]:
    if not lease_ids:
        return set()
    return set(Allocation.objects.filter(lease_id__in=lease_ids, period__contains=now)
               .values("lease_id").annotate(hosts=Count("gpu__node__host_id", distinct=True))
               .filter(hosts__gt=1).values_list("lease_id", flat=True))


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
    routes: Routes | None = None
    notices = list(LeaseLinkNotice.objects.filter(ended_at__isnull=True).select_related(
        "fault", "lease").order_by("pk"))
    faulty = {n.fault.link_id for n in notices if n.fault is not None and n.fault.ended_at is None}
    hca_cables = set(hosts_behind(faulty)) if faulty else set()
    switch_ports = _link_ports(faulty - hca_cables) if faulty - hca_cables else {}
    for notice in notices:
        fault = notice.fault
        what = "is back"
        ended = fault.ended_at if fault is not None else now
        if fault is None:
            what = "is no longer known (re-imported)"
        elif fault.ended_at is None and notice.lease.state not in LIVE_STATES:
            what, ended = "no longer concerns it (the lease ended)", now
        elif fault.ended_at is None:
            # still faulty: a switch link the lease's routes no longer cross (OpenSM routed
            # around it) closes its notice; an HCA cable never does
            if fault.link_id in hca_cables:
                continue
            ports = switch_ports.get(fault.link_id, set())
            routes = routes or Routes(now)
            if routes.route(fault.fabric_id) is None or \
                    notice.lease_id in routes.crossing(fault.fabric_id, ports):
                continue
            # from the poll that brought the routes around it
            what = "is off its routes (rerouted)"
            ended = max(routes.read_at[fault.fabric_id], notice.started_at)
        with transaction.atomic():
            if not LeaseLinkNotice.objects.filter(pk=notice.pk, ended_at__isnull=True) \
                    .update(ended_at=ended):
                continue  # closed meanwhile by an overlapping pass
            LeaseEvent.objects.create(
                lease=notice.lease, kind="link_restored", actor=ACTOR,
                reason=(f"link {notice.link_name} {what} at {ended:%Y-%m-%d %H:%M:%S} UTC "
                        f"({notice.kind} for {int((ended - notice.started_at).total_seconds())}"
                        " s)")[:500])
        restored += 1
    return restored


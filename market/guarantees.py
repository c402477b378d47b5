"""Guaranteed bandwidth on the real routes: which placement of a guaranteed order keeps every
link's guarantees within its rate × the fabric's `guarantee_ratio` (docs/fabric.md,
"Admission on the real routes"). The arithmetic is `fabric.core.admission`'s; this module reads
the leases that hold guarantees and the fabric's routes.

Standard and scavenger orders never come here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db.models import Count

from fabric.core import admission
from fabric.core.admission import Guarantee, Verdict
from fabric.core.locality import NodeKey
from fabric.core.partitions import rails_of_gpus
from fabric.core.qos import GUARANTEED
from fabric.core.routes import RouteMap
from fabric.models import Fabric, Host
from fabric.selectors import admission_routes
from market.models import Allocation, Lease, Order
from pool.core.workloads import ranks_in_order
from pool.models import Node

CANDIDATE_DOMAINS = 12  # leaves and spines whose placements admission compares per order

HOLDING = (Lease.State.PENDING, Lease.State.PLACING, Lease.State.ACTIVE,
           Lease.State.PREEMPTING)


def is_guaranteed(order: Order | None) -> bool:
    return order is not None and order.bandwidth_class == GUARANTEED and bool(order.gbps_per_gpu)


HostShapes = dict[str, tuple[int, int]]  # fabric host name -> (its GPUs, its HCAs)


def guarantee_of(reference: str, indexes_by_host: dict[str, list[int]], gbps: float,
                 shapes: HostShapes | None = None) -> Guarantee:
    """The lease as admission sees it: its hosts in rank order (hostname order, as its
    workload's ranks), its GPUs on each and, on hosts with one HCA per rail, each GPU's rail."""
    shapes = shapes or {}
    ranks = ranks_in_order(indexes_by_host)
    hosts = tuple(sorted(indexes_by_host, key=ranks.__getitem__))
    rails = tuple(rails_of_gpus(sorted(indexes_by_host[h]), shapes.get(h, (0, 0))[1],
                                shapes.get(h, (0, 0))[0]) for h in hosts)
    return Guarantee(reference, hosts, tuple(len(indexes_by_host[h]) for h in hosts), gbps,
                     rails if any(rails) else ())


def host_shapes(fabric: Fabric) -> HostShapes:
    """Each host of the fabric with several HCAs: its GPUs and HCAs (one query)."""
    return {name: (gpus, hcas) for name, gpus, hcas in Host.objects.filter(fabric=fabric)
            .annotate(hca_count=Count("hcas")).filter(hca_count__gt=1)
            .values_list("name", "gpus", "hca_count")}


def live_guarantees(fabric: Fabric, start: datetime, end: datetime,
                    exclude: Iterable[int] = (), shapes: HostShapes | None = None
                    ) -> list[Guarantee]:
    """Every guarantee held on `fabric` over [start, end), oldest lease first."""
    shapes = host_shapes(fabric) if shapes is None else shapes
    rows = (Allocation.objects
            .filter(gpu__node__host__fabric=fabric, period__overlap=(start, end),
                    lease__state__in=HOLDING, lease__order__bandwidth_class=GUARANTEED)
            .exclude(lease_id__in=list(exclude))
            .values_list("lease_id", "lease__created_at", "gpu__node__host__name", "gpu__index",
                         "lease__order__gbps_per_gpu"))
    hosts: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    meta: dict[int, tuple] = {}
    for lease_id, created, host, index, gbps in rows:
        hosts[lease_id][host].append(index)
        meta[lease_id] = (created, float(gbps))
    return [guarantee_of(f"L-{lease_id}", hosts[lease_id], meta[lease_id][1], shapes)
            for lease_id in sorted(meta, key=lambda pk: (meta[pk][0], pk))]


class FabricView:
    """One fabric's routes, ratio and guaranteed loads over a window, read once per order."""

    def __init__(self, fabric: Fabric, start: datetime, end: datetime, exclude=()):
        self.fabric = fabric
        self.route: RouteMap = admission_routes(fabric)
        self.ratio = float(fabric.guarantee_ratio)
        self.shapes = host_shapes(fabric)
        self.loads = admission.link_loads(self.route, live_guarantees(fabric, start, end,
                                                                       exclude, self.shapes))

    def check(self, reference: str, indexes_by_host: dict[str, list[int]],
              gbps: float) -> Verdict:
        return admission.check(self.route, self.loads,
                               guarantee_of(reference, indexes_by_host, gbps, self.shapes),
                               self.ratio)


def hosts_of_nodes(nodes: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
    """(fabric name, node hostname) -> (the fabric's id, the node's fabric host name)."""
    nodes = set(nodes)
    rows = Node.objects.filter(hostname__in={host for _, host in nodes},
                               fabric__name__in={fabric for fabric, _ in nodes}) \
        .exclude(state="retired") \
        .values_list("fabric__name", "hostname", "host__fabric_id", "host__name")
    return {(fabric, hostname): (fabric_id, host) for fabric, hostname, fabric_id, host in rows}


Placement = dict[tuple[str, str], list[int]]  # (fabric name, node hostname) -> GPU indexes


def verdict_of(placement: Placement, gbps: float, views: dict[int, FabricView],
               start: datetime, end: datetime, reference: str = "new", exclude=()) -> Verdict:
    """A placement checked on each fabric it uses: the worst fabric's verdict (a lease on
    several fabrics crosses no cable between them)."""
    where = hosts_of_nodes(placement)
    per_fabric: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for node, indexes in placement.items():
        fabric_id, host = where[node]
        per_fabric[fabric_id].setdefault(host, []).extend(indexes)
    tightest = Verdict(True, float("inf"))
    for fabric_id, hosts in per_fabric.items():
        if fabric_id not in views:
            views[fabric_id] = FabricView(Fabric.objects.get(pk=fabric_id), start, end, exclude)
        found = views[fabric_id].check(reference, hosts, gbps)
        if not found.ok:
            return found
        if found.headroom < tightest.headroom:
            tightest = found
    return tightest


def choose(order: Order, candidates: list[Placement], start: datetime, end: datetime,
           exclude=()) -> tuple[int | None, Verdict]:
    """Among candidate placements (the engine's own first), the feasible one with the most
    headroom; with none, (None, the first one's refusal)."""
    views: dict[int, FabricView] = {}
    chosen, best, first = None, None, None
    for index, candidate in enumerate(candidates):
        verdict = verdict_of(candidate, float(order.gbps_per_gpu), views, start, end,
                             exclude=exclude)
        first = first or verdict
        if verdict.ok and (best is None or verdict.headroom > best.headroom):
            chosen, best = index, verdict
    return chosen, best or first or Verdict(False, float("-inf"), None, "no placement")


def candidate_domains(free: dict[NodeKey, int], gpus: int,
                      limit: int = CANDIDATE_DOMAINS) -> list[list[NodeKey]]:
    """The leaves, then the spines, whose free GPUs (per node) hold `gpus`, the most free
    first, at most `limit`: where a guaranteed order's other placements are looked for, so
    that admission can choose the one with the most headroom (a leaf's placement crosses
    only its own links; a spine's, its own uplinks)."""
    domains: dict[tuple, list[NodeKey]] = defaultdict(list)
    for key in free:
        domains[("leaf", key.fabric, key.leaf)].append(key)
        domains[("spine", key.fabric, key.spine)].append(key)
    sized = sorted(((sum(free[k] for k in keys), name, keys) for name, keys in domains.items()),
                   key=lambda item: (-item[0], item[1]))
    return [keys for total, _name, keys in sized if total >= gpus][:limit]


def refusal_text(verdict: Verdict) -> str:
    return f"its guaranteed bandwidth does not fit: {verdict.reason}"

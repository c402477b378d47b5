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

from fabric.core import admission
from fabric.core.admission import Guarantee, Verdict
from fabric.core.qos import GUARANTEED
from fabric.core.routes import RouteMap
from fabric.models import Fabric
from fabric.selectors import admission_routes
from market.models import Allocation, Lease, Order
from pool.core.workloads import ranks_in_order
from pool.models import Node

HOLDING = (Lease.State.PENDING, Lease.State.PLACING, Lease.State.ACTIVE,
           Lease.State.PREEMPTING)


def is_guaranteed(order: Order | None) -> bool:
    return order is not None and order.bandwidth_class == GUARANTEED and bool(order.gbps_per_gpu)


def guarantee_of(reference: str, gpus_by_host: dict[str, int], gbps: float) -> Guarantee:
    """The lease as admission sees it: its hosts in rank order (hostname order, as its
    workload's ranks), its GPUs on each."""
    ranks = ranks_in_order(gpus_by_host)
    hosts = tuple(sorted(gpus_by_host, key=ranks.__getitem__))
    return Guarantee(reference, hosts, tuple(gpus_by_host[h] for h in hosts), gbps)


def live_guarantees(fabric: Fabric, start: datetime, end: datetime,
                    exclude: Iterable[int] = ()) -> list[Guarantee]:
    """Every guarantee held on `fabric` over [start, end), oldest lease first: one query."""
    rows = (Allocation.objects
            .filter(gpu__node__host__fabric=fabric, period__overlap=(start, end),
                    lease__state__in=HOLDING, lease__order__bandwidth_class=GUARANTEED)
            .exclude(lease_id__in=list(exclude))
            .values_list("lease_id", "lease__created_at", "gpu__node__host__name",
                         "lease__order__gbps_per_gpu"))
    hosts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    meta: dict[int, tuple] = {}
    for lease_id, created, host, gbps in rows:
        hosts[lease_id][host] += 1
        meta[lease_id] = (created, float(gbps))
    return [guarantee_of(f"L-{lease_id}", hosts[lease_id], meta[lease_id][1])
            for lease_id in sorted(meta, key=lambda pk: (meta[pk][0], pk))]


class FabricView:
    """One fabric's routes, ratio and guaranteed loads over a window, read once per order."""

    def __init__(self, fabric: Fabric, start: datetime, end: datetime, exclude=()):
        self.fabric = fabric
        self.route: RouteMap = admission_routes(fabric)
        self.ratio = float(fabric.guarantee_ratio)
        self.loads = admission.link_loads(self.route, live_guarantees(fabric, start, end,
                                                                       exclude))

    def check(self, guarantee: Guarantee) -> Verdict:
        return admission.check(self.route, self.loads, guarantee, self.ratio)


def hosts_of_nodes(nodes: Iterable[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, str]]:
    """(fabric name, node hostname) -> (the fabric's id, the node's fabric host name)."""
    nodes = set(nodes)
    rows = Node.objects.filter(hostname__in={host for _, host in nodes},
                               fabric__name__in={fabric for fabric, _ in nodes}) \
        .exclude(state="retired") \
        .values_list("fabric__name", "hostname", "host__fabric_id", "host__name")
    return {(fabric, hostname): (fabric_id, host) for fabric, hostname, fabric_id, host in rows}


def verdict_of(gpus_by_node: dict[tuple[str, str], int], gbps: float,
               views: dict[int, FabricView], start: datetime, end: datetime,
               reference: str = "new", exclude=()) -> Verdict:
    """A placement (GPUs per (fabric name, node hostname)) checked on each fabric it uses:
    the worst fabric's verdict (a lease on several fabrics crosses no cable between them)."""
    where = hosts_of_nodes(gpus_by_node)
    per_fabric: dict[int, dict[str, int]] = defaultdict(dict)
    for node, gpus in gpus_by_node.items():
        fabric_id, host = where[node]
        per_fabric[fabric_id][host] = per_fabric[fabric_id].get(host, 0) + gpus
    tightest = Verdict(True, float("inf"))
    for fabric_id, hosts in per_fabric.items():
        if fabric_id not in views:
            views[fabric_id] = FabricView(Fabric.objects.get(pk=fabric_id), start, end, exclude)
        found = views[fabric_id].check(guarantee_of(reference, hosts, gbps))
        if not found.ok:
            return found
        if found.headroom < tightest.headroom:
            tightest = found
    return tightest


def choose(order: Order, candidates: list[dict[tuple[str, str], int]], start: datetime, end: datetime,
           exclude=()) -> tuple[int | None, Verdict]:
    """Among candidate placements (GPUs per (fabric, node hostname), the engine's own first), the
    feasible one with the most headroom; with none, (None, the first one's refusal)."""
    views: dict[int, FabricView] = {}
    chosen, best, first = None, None, None
    for index, candidate in enumerate(candidates):
        verdict = verdict_of(candidate, float(order.gbps_per_gpu), views, start, end,
                             exclude=exclude)
        first = first or verdict
        if verdict.ok and (best is None or verdict.headroom > best.headroom):
            chosen, best = index, verdict
    return chosen, best or first or Verdict(False, float("-inf"), None, "no placement")


def refusal_text(verdict: Verdict) -> str:
    return f"its guaranteed bandwidth does not fit: {verdict.reason}"

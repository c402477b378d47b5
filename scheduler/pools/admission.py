"""Private pools: admit queued orders under the pool's quotas, place them, reclaim lent GPUs.

One pass per pool (`admit_pool`, run by a beat task and queued when an order arrives), under
the pool's row lock so two passes never admit against the same usage:

1. the pure admission (`pool.core.quotas.admit`) over the queued orders: priority classes first,
   FIFO within a priority, queues within their nominal before borrowers, borrowers by
   dominant share;
2. each admitted order is placed on the pool's free GPUs with the placement engine (the path
   market orders take: `scheduler.placement`, a lease, `scheduler.place_lease` through the
   outbox). Other queues' shaped guarantees (`QuotaNode.shape_nodes`, whole nodes in one leaf)
   are kept placeable: the whole nodes `pool.core.quotas.reserve_cells` sets aside for them are
   excluded from the placement input;
3. each order still waiting whose queue is within its nominal (or whose queue lets a higher
   priority preempt its own lower priorities) reclaims: `pool.core.quotas.reclaim` picks the
   fewest leases (lowest priority, newest first) and they get the spot preemption notice;
4. every order still waiting records its position in the pool's queue and the reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from fabric.core.locality import WIDEST_FIRST, Locality, NodeKey
from market import guarantees, leasing, parts, pool_orders
from market.models import Lease, Order
from pool import quotas
from pool.core import quotas as core
from pool.core.workloads import why_runtimes
from pool.models import Gpu, Pool, QuotaNode
from pool.services import offered_gpus
from scheduler.core.clearing_placer import demands_of
from scheduler.core.placement import Node, PlacementIndex, Request, Slice
from scheduler.pools import tides
from scheduler.pools.running import epoch, running_of

OS = Order.State


@dataclass
class PassReport:
    pool: str
    admitted: list[int] = field(default_factory=list)
    waiting: dict[int, str] = field(default_factory=dict)
    preempted: list[int] = field(default_factory=list)


@dataclass
class FreeNode:
    key: NodeKey
    gpus: list[tuple[int, int]]  # (gpu id, index), lowest index first
    total: int
    model: str
    runtime: str = "none"  # what its agent runs (`pool.models.Node.Runtime`)


def workload_of(order: Order) -> core.Workload:
    return core.Workload(id=str(order.pk), queue=order.quota_node.name,
                         model=order.gpu_models[0], gpus=order.gpus, priority=order.priority,
                         submitted_at=epoch(order.created_at))


def free_nodes(pool: Pool, start: datetime, end: datetime) -> dict[str, FreeNode]:
    """The pool's offered nodes (healthy, active) with their GPUs free over [start, end)."""
    totals = dict(Gpu.objects.filter(node__pools=pool).order_by().values_list("node__hostname")
                  .annotate(n=Count("id")))
    rows = (offered_gpus().filter(node__pools=pool)
            .exclude(allocations__period__overlap=(start, end))
            .values_list("id", "index", "node__fabric__name", "node__host__spine",
                         "node__host__leaf", "node__hostname", "gpu_model__name",
                         "node__runtime"))
    nodes: dict[str, FreeNode] = {}
    for gpu_id, index, fabric, spine, leaf, host, model, runtime in rows:
        node = nodes.setdefault(host, FreeNode(NodeKey(fabric, spine, leaf, host), [],
                                               totals.get(host, 0), model, runtime))
        node.gpus.append((gpu_id, index))
    for node in nodes.values():
        node.gpus.sort(key=lambda g: g[1])
    return nodes


def _leaf(node: FreeNode) -> str:
    return node.key.labels["leaf"]


def reserved_nodes(nodes: dict[str, FreeNode], shapes: dict[str, int]) -> set[str]:
    """Whole free nodes set aside so that every shape (quota → whole nodes in one leaf) stays
    placeable: HiveD's reserved cells, chosen by `pool.core.quotas.reserve_cells`."""
    if not shapes:
        return set()
    whole: dict[str, list[str]] = defaultdict(list)
    for name, node in sorted(nodes.items()):
        if node.total and len(node.gpus) == node.total:
            whole[_leaf(node)].append(name)
    cells = core.reserve_cells({leaf: len(names) for leaf, names in whole.items()}, shapes)
    per_leaf: dict[str, int] = defaultdict(int)
    for holder, leaf in cells.items():
        if leaf is not None:
            per_leaf[leaf] += shapes[holder]
    out = set()
    for leaf, count in per_leaf.items():
        out.update(whole[leaf][:count])
    return out


def shapes_of(pool: Pool, usage: core.Usage) -> dict[str, int]:
    """Each shaped queue's whole nodes still to keep free: its shape less what it uses."""
    out = {}
    for name, shape in QuotaNode.objects.filter(pool=pool, shape_nodes__gt=0).values_list(
            "name", "shape_nodes"):
        used_nodes = -(-sum(usage.get(name, {}).values()) // 8)
        if shape - used_nodes > 0:
            out[name] = shape - used_nodes
    return out


class PoolPlacer:
    """One pass's view of a pool's free GPUs: places orders and takes their GPUs."""

    def __init__(self, pool: Pool, start: datetime, horizon: datetime, shapes: dict[str, int]):
        self.nodes = free_nodes(pool, start, horizon)
        self.start = start
        self.shapes = shapes
        self.mix = demands_of(parts.recent_mix(pool.pk))  # the pool's own recent orders
        self.index = PlacementIndex(WIDEST_FIRST, [
            Node(name=name, labels=n.key.labels,
                 free_gpus=len(n.gpus), gpu_model=n.model, total_gpus=len(n.gpus))
            for name, n in sorted(self.nodes.items())])

    def place(self, order: Order) -> tuple[list[tuple[NodeKey, int]] | None, str]:
        """[(node key, gpu id)] for the order, or None and the reason. Only nodes whose
        runtime can run what the order asks are used (`pool.core.workloads.runtimes_for`)."""
        others = {q: n for q, n in self.shapes.items() if q != order.quota_node.name}
        topology = order.topology or {}
        whole = topology.get("whole_nodes")
        reserved = frozenset(reserved_nodes(self.nodes, others))
        runtimes = leasing.runtimes_of(order)
        unfit = frozenset() if runtimes is None else frozenset(
            name for name, node in self.nodes.items() if node.runtime not in runtimes)
        request = Request(gpus=order.gpus, required=topology.get("required"),
                          preferred=topology.get("preferred"),
                          slice=Slice(8, "node") if whole else None,
                          gpu_models=frozenset(order.gpu_models),
                          exclude_nodes=reserved | unfit, mix=self.mix)
        placement = self.index.place(request)
        if not placement.placed:
            if unfit and self.index.place(replace(request, exclude_nodes=reserved)).placed:
                assert runtimes is not None
                fitting = sum(len(node.gpus) for name, node in self.nodes.items()
                              if name not in unfit and name not in reserved)
                return None, (f"only {fitting} of {order.gpus} GPUs are on nodes that can run "
                              f"it; {why_runtimes(runtimes)}")
            return None, placement.reason
        if guarantees.is_guaranteed(order):
            return self._most_headroom(order, request, placement.assignment)
        return self._gpus_of(placement.assignment), ""

    def _gpus_of(self, assignment: dict[str, int]) -> list[tuple[NodeKey, int]]:
        chosen = []
        for name, count in sorted(assignment.items()):
            node = self.nodes[name]
            chosen += [(node.key, gpu_id) for gpu_id, _ in node.gpus[:count]]
        return chosen

    def _most_headroom(self, order: Order, request: Request, assignment: dict[str, int]
                       ) -> tuple[list[tuple[NodeKey, int]] | None, str]:
        """A guaranteed order's placement: the engine's, or its choice inside another leaf or
        spine, whichever keeps the most headroom on the routes (docs/fabric.md, "Admission on
        the real routes"); None and the saturated link where none holds the guarantee."""
        usable = {node.key: len(node.gpus) for name, node in self.nodes.items()
                  if name not in request.exclude_nodes and node.gpus}
        assignments = [assignment]
        for keys in guarantees.candidate_domains(usable, order.gpus):
            inside = {key.host for key in keys}
            outside = frozenset(name for name in self.nodes if name not in inside)
            found = self.index.place(replace(request,
                                             exclude_nodes=request.exclude_nodes | outside))
            if found.placed:
                assignments.append(found.assignment)
        index, verdict = guarantees.choose(
            order, [self._indexes_of(assignment) for assignment in assignments],
            self.start, self.start + timedelta(hours=order.hours))
        if index is None:
            return None, guarantees.refusal_text(verdict)
        return self._gpus_of(assignments[index]), ""

    def _indexes_of(self, assignment: dict[str, int]) -> dict[tuple[str, str], list[int]]:
        """(fabric, node hostname) -> the indexes of the GPUs `_gpus_of` would take."""
        return {(self.nodes[name].key.fabric, name):
                [index for _gpu, index in self.nodes[name].gpus[:count]]
                for name, count in assignment.items() if count}

    def take(self, chosen: list[tuple[NodeKey, int]]) -> None:
        taken = defaultdict(set)
        for key, gpu_id in chosen:
            taken[key.host].add(gpu_id)
        self.index.commit({name: len(ids) for name, ids in taken.items()})
        for name, ids in taken.items():
            self.nodes[name].gpus = [g for g in self.nodes[name].gpus if g[0] not in ids]


def admit_pool(*, pool_id: int, now: datetime | None = None) -> PassReport:
    """One admission pass over a pool's queued orders (see the module docstring)."""
    now = now or timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=pool_id)
        report = PassReport(pool.name)
        tree = quotas.quota_tree(pool)
        leases = list(pool_orders.pool_leases(pool).order_by("pk"))
        running = running_of(leases)
        usage = core.usage_of(running)
        queued = {str(o.pk): o for o in Order.objects.select_for_update(skip_locked=True, of=("self",))
                  .filter(pool=pool, state=OS.QUEUED).select_related("quota_node", "tenant")}
        if queued:
            _admit_and_place(pool, tree, usage, running, leases, queued, now, report)
    tides.check_in_force(pool=pool, now=now)
    return report


def _admit_and_place(pool, tree, usage, running, leases, queued, now, report) -> None:
    admission = core.admit(tree, usage, [workload_of(o) for o in queued.values()])
    waiting: dict[str, str] = {w.id: reason for w, reason in admission.waiting}
    placer = None
    if admission.admitted:
        horizon = now + timedelta(hours=max(queued[w.id].hours for w, _ in admission.admitted))
        placer = PoolPlacer(pool, now, horizon, shapes_of(pool, usage))
    for workload, borrowed in admission.admitted:
        order = queued[workload.id]
        chosen, why = placer.place(order)
        if chosen is None:
            waiting[workload.id] = f"within quota, but no room to place it: {why}"
            continue
        note = f"admitted in queue {workload.queue}" + (
            f", borrowing {borrowed}" if borrowed else "")
        try:
            with transaction.atomic():
                lease = pool_orders.fill_pool_order(
                    order=order, gpus=[leasing.GpuChoice(g, 0) for _, g in chosen],
                    gpu_model=workload.model, starts_at=now,
                    locality=Locality.of(k for k, _ in chosen).to_json(), reason=note)
        except leasing.GpusUnavailable:
            waiting[workload.id] = "its GPUs were taken meanwhile; next pass"
            continue
        placer.take(chosen)
        report.admitted.append(order.pk)
        leases.append(lease)
    _reclaim(tree, leases, queued, waiting, now, report)
    _record_waiting(queued, waiting, report)


def _reclaim(tree, leases, queued, waiting, now, report) -> None:
    """Orders waiting for quota take their GPUs back from borrowers (or from their own
    queue's lower priorities when its policy allows), with notice."""
    by_id = {str(lease.pk): lease for lease in leases}
    holding = [lease for lease in leases if lease.state != Lease.State.PREEMPTING]
    running = running_of(holding)
    usage = core.usage_of(running)
    for order_id in sorted(waiting, key=lambda i: core.queue_order(workload_of(queued[i]))):
        if waiting[order_id].startswith(("within quota", "its GPUs")):
            continue  # admitted by quota: waits for room, not for quota
        workload = workload_of(queued[order_id])
        if workload.gpus <= core.available_to(tree, workload.queue, workload.model, usage):
            # fits once the leases already under notice have ended: promised, nothing more
            waiting[order_id] = ("fits its quota once leases under preemption notice have "
                                 "ended")
            usage = core.with_usage(usage, workload.queue, workload.model, workload.gpus)
            continue
        victims = core.reclaim(tree, usage, running, workload)
        if not victims:
            continue
        gpus = sum(by_id[v].gpu_count for v in victims)
        for victim in victims:
            lease = by_id[victim]
            leasing.give_notice(
                lease=lease, now=now, actor="scheduler",
                reason=f"reclaimed for order {order_id} in queue {workload.queue}")
            report.preempted.append(lease.pk)
        waiting[order_id] = (f"reclaiming {gpus} GPUs from {len(victims)} lease(s) "
                             f"({', '.join(victims)}); they end after their notice")
        running = [r for r in running if r.id not in victims]
        usage = core.usage_of(running)
        # the reclaimed GPUs are promised to this order: count it as using them
        usage = core.with_usage(usage, workload.queue, workload.model, workload.gpus)


def _record_waiting(queued, waiting, report) -> None:
    order = sorted(waiting, key=lambda i: core.queue_order(workload_of(queued[i])))
    for position, order_id in enumerate(order, start=1):
        pool_orders.set_waiting(order_id=int(order_id), position=position,
                                reason=waiting[order_id])
        report.waiting[int(order_id)] = waiting[order_id]


def admit_all_pools(*, now: datetime | None = None) -> dict[str, int]:
    """The beat: one pass per private pool with quota (queued orders or open tidal runs)."""
    out = {}
    for pool_id, name in Pool.objects.filter(kind=Pool.Kind.PRIVATE, quota_nodes__isnull=False
                                             ).distinct().values_list("pk", "name"):
        out[name] = len(admit_pool(pool_id=pool_id, now=now).admitted)
    return out

"""Defragmentation: propose moves of movable leases so that whole free nodes and leaves form.

Pure Python over plain data (no Django), so it is tested on hand-built layouts and the Celery
task (`scheduler/moves/defrag.py`) only builds the snapshot and applies the moves.

    plan_defrag(nodes: [NodeView], leases: [LeaseView], max_moves=20) -> Plan(moves, before, after)

A node is whole free when every GPU on it is healthy and held by no lease; a leaf when every
node on it is. The planner takes one movable lease at a time, frees its GPUs in thought, and
tries every target it may go to: one node, or one leaf (packed two ways: the fullest nodes
first, or the fewest nodes). A target is allowed when its GPUs are of the lease's model, free
and healthy, priced within the lease's limit and free until the lease ends (or already the
lease's own), in the lease's fabric, on a node whose runtime can run what the lease asks, and
when the lease ends no farther apart than it was (a lease on one node stays on one node; any
other goes to one node or one leaf), so no topology constraint is ever broken.

Targets are compared by what the whole pool gains, in this order: whole free leaves, whole free
nodes, fewer leaves the lease spans, fewer nodes it spans, free GPUs gathered in fewer leaves
(the sum of squared free counts per leaf); the same sum per node only breaks ties. The best
target is taken only when it is strictly better on one of the first five without being worse
on an earlier one, so every move makes the pool better and the planner always stops. A lease
moves at most once per plan, and a plan makes at most `max_moves` moves.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSlot:
    id: int
    healthy: bool = True
    price_micros: int | None = None  # None: not for sale, so never a target
    free_until: float | None = None  # when its next allocation starts; None: never


@dataclass(frozen=True)
class NodeView:
    name: str
    leaf: str  # unique across fabrics ("fabric/leaf")
    gpu_model: str
    gpus: tuple[GpuSlot, ...]
    fabric: str = ""  # a lease never leaves its fabric
    runtime: str = "none"  # what its agent runs (`pool.models.Node.Runtime`)


@dataclass(frozen=True)
class LeaseView:
    id: int
    gpu_model: str
    gpus: frozenset[int]
    movable: bool
    max_price_micros: int = 0
    ends_at: float = float("inf")
    # the node runtimes that can run what it asks (`pool.core.workloads.runtimes_for`);
    # None: any node
    runtimes: frozenset[str] | None = None


@dataclass(frozen=True)
class Move:
    lease: int
    away_from: tuple[int, ...]
    onto: tuple[tuple[int, int], ...]  # (GPU id, its price)


@dataclass(frozen=True)
class Counts:
    whole_free_leaves: int
    whole_free_nodes: int
    free_gpus: int


@dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...]
    before: Counts
    after: Counts


class _Pool:
    """The mutable state of one plan: who holds each GPU, free counts per node and leaf."""

    def __init__(self, nodes: list[NodeView], leases: list[LeaseView]):
        self.nodes = {n.name: n for n in nodes}
        self.slot = {g.id: g for n in nodes for g in n.gpus}
        self.node_of = {g.id: n.name for n in nodes for g in n.gpus}
        self.leaf_nodes: dict[str, list[str]] = defaultdict(list)
        for n in nodes:
            self.leaf_nodes[n.leaf].append(n.name)
        self.owner: dict[int, int] = {}
        self.held: dict[int, set[int]] = {}
        for lease in leases:
            self.held[lease.id] = set(lease.gpus)
            for gpu in lease.gpus:
                self.owner[gpu] = lease.id
        self.free = {n.name: sum(1 for g in n.gpus if self._is_free(g.id)) for n in nodes}
        self.size = {n.name: len(n.gpus) for n in nodes}
        self.leaf_free = {leaf: sum(self.free[n] for n in names)
                          for leaf, names in self.leaf_nodes.items()}
        self.leaf_partial = {leaf: sum(1 for n in names if not self._whole(n))
                             for leaf, names in self.leaf_nodes.items()}

    def _is_free(self, gpu: int) -> bool:
        return self.slot[gpu].healthy and gpu not in self.owner

    def _whole(self, node: str) -> bool:
        return self.free[node] == self.size[node]

    def counts(self) -> Counts:
        leaves = whole_free_leaves((n.leaf, self._whole(name)) for name, n in self.nodes.items())
        return Counts(whole_free_leaves=sum(leaves.values()),
                      whole_free_nodes=sum(1 for n in self.free if self._whole(n)),
                      free_gpus=sum(self.free.values()))

    def gain(self, lease: LeaseView, target: set[int]) -> tuple:
        """What moving the lease onto `target` changes, as the comparison vector."""
        old = self.held[lease.id]
        delta: dict[str, int] = defaultdict(int)
        for gpu in old - target:
            delta[self.node_of[gpu]] += self.slot[gpu].healthy
        for gpu in target - old:
            delta[self.node_of[gpu]] -= 1
        whole_nodes = node_sq = 0
        per_leaf: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for node, change in delta.items():
            before, after, size = self.free[node], self.free[node] + change, self.size[node]
            whole_nodes += (after == size) - (before == size)
            node_sq += after * after - before * before
            leaf = per_leaf[self.nodes[node].leaf]
            leaf[0] += change
            leaf[1] += (after != size) - (before != size)
        whole_leaves = leaf_sq = 0
        for leaf, (change, partial) in per_leaf.items():
            before = self.leaf_free[leaf]
            whole_leaves += (self.leaf_partial[leaf] + partial == 0) - (self.leaf_partial[leaf] == 0)
            leaf_sq += (before + change) ** 2 - before * before
        old_nodes = {self.node_of[g] for g in old}
        new_nodes = {self.node_of[g] for g in target}
        leaves = len({self.nodes[n].leaf for n in old_nodes}) - len(
            {self.nodes[n].leaf for n in new_nodes})
        return (whole_leaves, whole_nodes, leaves, len(old_nodes) - len(new_nodes), leaf_sq,
                node_sq)

    def apply(self, lease: LeaseView, target: set[int]) -> None:
        old = self.held[lease.id]
        for gpu in old - target:
            del self.owner[gpu]
            if self.slot[gpu].healthy:
                self._shift(self.node_of[gpu], +1)
        for gpu in target - old:
            self.owner[gpu] = lease.id
            self._shift(self.node_of[gpu], -1)
        self.held[lease.id] = set(target)

    def _shift(self, node: str, change: int) -> None:
        leaf = self.nodes[node].leaf
        was_whole = self._whole(node)
        self.free[node] += change
        self.leaf_free[leaf] += change
        self.leaf_partial[leaf] += was_whole - self._whole(node)

    def usable(self, lease: LeaseView, node: NodeView) -> list[int]:
        """GPUs of the node the lease may hold: its own first, then the cheapest free ones."""
        if node.gpu_model != lease.gpu_model:
            return []
        mine = self.held[lease.id]
        own = [g.id for g in node.gpus if g.id in mine and g.healthy]
        if lease.runtimes is not None and node.runtime not in lease.runtimes:
            return own  # its agent cannot run the lease: gather it nowhere new here
        free = sorted(
            (g for g in node.gpus
             if g.id not in mine and self._is_free(g.id) and g.price_micros is not None
             and g.price_micros <= lease.max_price_micros
             and (g.free_until is None or g.free_until >= lease.ends_at)),
            key=lambda g: (g.price_micros, g.id))
        return own + [g.id for g in free]


def _targets(pool: _Pool, lease: LeaseView):
    """Every allowed target: one node; or one leaf unless the lease sits on one node."""
    count = len(lease.gpus)
    fabrics = {pool.nodes[pool.node_of[g]].fabric for g in lease.gpus}
    usable = {name: pool.usable(lease, node) if {node.fabric} == fabrics else []
              for name, node in pool.nodes.items()}
    for gpus in usable.values():
        if len(gpus) >= count:
            yield set(gpus[:count])
    if len({pool.node_of[g] for g in lease.gpus}) == 1:
        return
    mine = pool.held[lease.id]
    for names in pool.leaf_nodes.values():
        having = [n for n in names if usable[n]]
        if sum(len(usable[n]) for n in having) < count:
            continue
        fullest = sorted(having, key=lambda n: (not (set(usable[n]) & mine), len(usable[n]), n))
        fewest = sorted(having, key=lambda n: (-len(usable[n]), n))
        for order in (fullest, fewest):
            chosen: list[int] = []
            for name in order:
                chosen += usable[name][:count - len(chosen)]
                if len(chosen) == count:
                    break
            yield set(chosen)


def plan_defrag(nodes: list[NodeView], leases: list[LeaseView], max_moves: int = 20) -> Plan:
    pool = _Pool(nodes, leases)
    before = pool.counts()
    known = set(pool.slot)
    candidates = [lease for lease in leases
                  if lease.movable and lease.gpus and lease.gpus <= known]
    moves: list[Move] = []
    moved: set[int] = set()
    progress = True
    while progress and len(moves) < max_moves:
        progress = False
        # The leases on the emptiest leaves first: moving them is likeliest to free a leaf.
        candidates.sort(key=lambda lease: (
            -max(pool.leaf_free[pool.nodes[pool.node_of[g]].leaf] for g in pool.held[lease.id]),
            len(lease.gpus), lease.id))
        for lease in candidates:
            if lease.id in moved or len(moves) >= max_moves:
                continue
            current = pool.held[lease.id]
            best, best_gain = None, None
            for target in _targets(pool, lease):
                if target == current:
                    continue
                gain = pool.gain(lease, target)
                if best_gain is None or gain > best_gain:
                    best, best_gain = target, gain
            if best is None or not best_gain[:5] > (0, 0, 0, 0, 0):
                continue
            moves.append(Move(
                lease=lease.id, away_from=tuple(sorted(current - best)),
                onto=tuple((g, pool.slot[g].price_micros) for g in sorted(best - current))))
            pool.apply(lease, best)
            moved.add(lease.id)
            progress = True
    return Plan(moves=tuple(moves), before=before, after=pool.counts())


def whole_free_leaves(nodes: Iterable[tuple[Hashable, bool]]) -> dict[Hashable, bool]:
    """Each leaf → whether it is whole free, that is every node on it is; `nodes` gives each
    node's (leaf, whole free). The operations page counts them the same way."""
    leaves: dict[Hashable, bool] = {}
    for leaf, whole in nodes:
        leaves[leaf] = leaves.get(leaf, True) and whole
    return leaves


def whole_free_counts(nodes: list[NodeView], leases: list[LeaseView]) -> Counts:
    """Whole free leaves and nodes, and free GPUs, of a snapshot (no planning)."""
    return _Pool(nodes, leases).counts()

"""Quotas and admission: the pure core (no Django).

Modelled on Kueue's ClusterQueues, (hierarchical) cohorts and fair sharing, plus reclaim
selection, tidal schedules and HiveD-style shaped guarantees.  Everything here is plain,
deterministic Python over frozen dataclasses; see ``docs/quotas.md`` for the rules and a
worked example.

Vocabulary
- a *queue* is a leaf ``QuotaNode``: workloads are submitted to it and leases run in it;
- an inner ``QuotaNode`` (a university, a department, or a plain cohort) groups children that
  lend to each other; it may hold GPUs of its own (``nominal``);
- ``usage`` maps queue → model → GPUs in use (inner nodes' usage is derived).

The capacity rule (per model, Kueue's hierarchical cohort arithmetic)::

    guaranteed(n) = max(0, subtree(n) - lending_limit(n))   # 0 when lending_limit is None
    subtree(n)    = nominal(n) + Σ_children (subtree(c) - guaranteed(c))
    used(leaf)    = usage[leaf]
    used(inner)   = Σ_children max(0, used(c) - guaranteed(c))
    available(root) = subtree(root) - used(root)
    available(n)    = max(0, guaranteed(n) - used(n)) + parent_part
        parent_part = available(parent(n)), and when borrowing_limit(n) is set, at most
                      (subtree(n) - guaranteed(n)) - max(0, used(n) - guaranteed(n))
                      + borrowing_limit(n)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

Usage = Mapping[str, Mapping[str, int]]


class QuotaError(ValueError):
    """An ill-formed quota tree or schedule."""


@dataclass(frozen=True)
class ModelQuota:
    """The quota of one node for one GPU model."""

    nominal: int = 0
    borrowing_limit: int | None = None  # None: may borrow whatever the cohort can lend
    lending_limit: int | None = None  # None: all of its (subtree) quota may be lent

    def __post_init__(self):
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise QuotaError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True)
class QuotaNode:
    """A queue (leaf) or a group of queues (inner node).

    ``parent`` nests the node under another node; ``cohort`` is a shorthand for a parent that
    is a plain cohort (no GPUs of its own, no limits): nodes naming the same cohort lend to each
    other.  A node names at most one of them.
    """

    name: str
    parent: str | None = None
    cohort: str | None = None
    quotas: Mapping[str, ModelQuota] = field(default_factory=dict, hash=False)
    preempt_within_queue: bool = False

    def quota(self, model: str) -> ModelQuota | None:
        return self.quotas.get(model)


@dataclass(frozen=True)
class Workload:
    """A pending request for ``gpus`` GPUs of ``model`` in ``queue``."""

    id: str
    queue: str
    model: str
    gpus: int
    priority: int = 0
    submitted_at: float = 0


@dataclass(frozen=True)
class RunningLease:
    """A lease that holds GPUs now."""

    id: str
    queue: str
    model: str
    gpus: int
    priority: int = 0
    started_at: float = 0


@dataclass(frozen=True)
class Admission:
    admitted: tuple[tuple[Workload, int], ...]  # (workload, GPUs borrowed beyond nominal)
    waiting: tuple[tuple[Workload, str], ...]  # (workload, reason a tenant can read)
    usage: Mapping[str, Mapping[str, int]] = field(default_factory=dict, hash=False)


class QuotaTree:
    """An immutable, validated set of quota nodes (a forest)."""

    def __init__(self, nodes: Iterable[QuotaNode]):
        by_name: dict[str, QuotaNode] = {}
        for node in nodes:
            if node.name in by_name:
                raise QuotaError(f"duplicate quota node {node.name!r}")
            if node.parent is not None and node.cohort is not None:
                raise QuotaError(f"{node.name!r} names both a parent and a cohort")
            by_name[node.name] = node
        # A cohort named by a node but not defined becomes a plain cohort node.
        for node in list(by_name.values()):
            if node.cohort is not None:
                by_name.setdefault(node.cohort, QuotaNode(node.cohort))
        resolved: dict[str, QuotaNode] = {}
        for node in by_name.values():
            parent = node.parent if node.parent is not None else node.cohort
            if parent is not None and parent not in by_name:
                raise QuotaError(f"{node.name!r}: unknown parent {parent!r}")
            resolved[node.name] = replace(node, parent=parent, cohort=None)
        self._nodes = dict(sorted(resolved.items()))
        self._children: dict[str, tuple[str, ...]] = {name: () for name in self._nodes}
        for node in self._nodes.values():
            if node.parent is not None:
                self._children[node.parent] += (node.name,)
        for name in self._nodes:  # no cycles
            seen = set()
            cur: str | None = name
            while cur is not None:
                if cur in seen:
                    raise QuotaError(f"quota tree has a cycle through {name!r}")
                seen.add(cur)
                cur = self._nodes[cur].parent
        self._cache: dict[tuple[str, str], tuple[int, int]] = {}

    # -- structure ---------------------------------------------------------------------
    @property
    def nodes(self) -> Mapping[str, QuotaNode]:
        return dict(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def node(self, name: str) -> QuotaNode:
        try:
            return self._nodes[name]
        except KeyError:
            raise QuotaError(f"unknown quota node {name!r}") from None

    def children(self, name: str) -> tuple[str, ...]:
        return self._children[name]

    def is_queue(self, name: str) -> bool:
        return not self._children[self.node(name).name]

    def queues(self) -> list[str]:
        return [n for n in self._nodes if not self._children[n]]

    def ancestors(self, name: str) -> list[str]:
        out, cur = [], self.node(name).parent
        while cur is not None:
            out.append(cur)
            cur = self._nodes[cur].parent
        return out

    def root(self, name: str) -> str:
        chain = [name, *self.ancestors(name)]
        return chain[-1]

    def models(self) -> list[str]:
        return sorted({m for n in self._nodes.values() for m in n.quotas})

    def with_nominals(self, nominals: Mapping[str, Mapping[str, int]]) -> QuotaTree:
        """A copy in which the named nodes get new nominal quotas (limits kept)."""
        nodes = []
        for node in self._nodes.values():
            new = nominals.get(node.name)
            if new:
                quotas = dict(node.quotas)
                for model, nominal in new.items():
                    quotas[model] = replace(quotas.get(model, ModelQuota()), nominal=nominal)
                node = replace(node, quotas=quotas)
            nodes.append(node)
        return QuotaTree(nodes)

    # -- static arithmetic (independent of usage) -------------------------------------
    def _static(self, name: str, model: str) -> tuple[int, int]:
        """(subtree quota, guaranteed quota) of a node for a model."""
        key = (name, model)
        if key not in self._cache:
            node = self._nodes[name]
            q = node.quota(model) or ModelQuota()
            subtree = q.nominal
            for child in self._children[name]:
                c_sub, c_guar = self._static(child, model)
                subtree += c_sub - c_guar
            guaranteed = 0 if q.lending_limit is None else max(0, subtree - q.lending_limit)
            self._cache[key] = (subtree, guaranteed)
        return self._cache[key]

    def subtree_quota(self, name: str, model: str) -> int:
        return self._static(self.node(name).name, model)[0]

    def guaranteed(self, name: str, model: str) -> int:
        return self._static(self.node(name).name, model)[1]

    def nominal(self, name: str, model: str) -> int:
        q = self.node(name).quota(model)
        return q.nominal if q else 0

    def capacity(self, name: str, model: str) -> int:
        """All nominal quota under a node (its own plus its descendants'), lendable or not."""
        node = self.node(name)
        return self.nominal(node.name, model) + sum(
            self.capacity(c, model) for c in self._children[node.name])

    def lendable(self, name: str, model: str) -> int:
        """What a node contributes to its parent's pool."""
        subtree, guaranteed = self._static(self.node(name).name, model)
        return subtree - guaranteed

    # -- usage arithmetic ---------------------------------------------------------------
    def used(self, name: str, model: str, usage: Usage) -> int:
        """GPUs in use under a node, as its parent counts them (Kueue's cohort usage)."""
        if not self._children[name]:
            return int(usage.get(name, {}).get(model, 0))
        total = 0
        for child in self._children[name]:
            total += max(0, self.used(child, model, usage) - self._static(child, model)[1])
        return total

    def total_used(self, name: str, model: str, usage: Usage) -> int:
        """All GPUs in use by the queues under a node."""
        if not self._children[name]:
            return int(usage.get(name, {}).get(model, 0))
        return sum(self.total_used(c, model, usage) for c in self._children[name])

    def available(self, name: str, model: str, usage: Usage) -> int:
        """Kueue's ``available``: how much more the subtree of ``name`` may take now."""
        node = self._nodes[name]
        subtree, guaranteed = self._static(name, model)
        used = self.used(name, model, usage)
        if node.parent is None:
            return subtree - used
        local = max(0, guaranteed - used)
        parent_part = self.available(node.parent, model, usage)
        q = node.quota(model) or ModelQuota()
        if q.borrowing_limit is not None:
            stored = subtree - guaranteed
            used_in_parent = max(0, used - guaranteed)
            parent_part = min(parent_part, stored - used_in_parent + q.borrowing_limit)
        return local + parent_part


def _get(usage: Usage, queue: str, model: str) -> int:
    return int(usage.get(queue, {}).get(model, 0))


def _add(usage: Mapping[str, Mapping[str, int]], queue: str, model: str, gpus: int):
    new = {q: dict(m) for q, m in usage.items()}
    new.setdefault(queue, {})
    new[queue][model] = new[queue].get(model, 0) + gpus
    return new


def available_to(tree: QuotaTree, node: str, model: str, usage: Usage) -> int:
    """How many more GPUs of ``model`` the queue (or subtree) ``node`` may take now.

    Its unused guaranteed quota plus what its parent chain can still give it, bounded at each
    level by borrowing limits (see the module docstring).  A queue with no quota entry for the
    model may take none.
    """
    n = tree.node(node)
    if tree.is_queue(node) and n.quota(model) is None:
        return 0
    return max(0, tree.available(node, model, usage))


def borrowed(tree: QuotaTree, queue: str, model: str, usage: Usage) -> int:
    """GPUs a queue uses beyond its own nominal quota."""
    return max(0, _get(usage, queue, model) - tree.nominal(queue, model))


def dominant_share(tree: QuotaTree, queue: str, usage: Usage) -> Fraction:
    """Max over models of usage / nominal (a model used with no nominal counts as infinite)."""
    share = Fraction(0)
    for model, used in sorted(usage.get(queue, {}).items()):
        if used <= 0:
            continue
        nominal = tree.nominal(queue, model)
        if nominal == 0:
            return Fraction(10**18)
        share = max(share, Fraction(used, nominal))
    return share


def _gpus(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def waiting_reason(tree: QuotaTree, workload: Workload, usage: Usage) -> str:
    """Why a workload cannot be admitted now, in words a tenant can read."""
    w = workload
    if w.queue not in tree:
        return f"no quota queue named {w.queue}"
    if not tree.is_queue(w.queue):
        return f"{w.queue} groups other queues; submit to one of them"
    q = tree.node(w.queue).quota(w.model)
    if q is None:
        return f"quota {w.queue} has no quota for {w.model}"
    used = _get(usage, w.queue, w.model)
    free = max(0, q.nominal - used)
    avail = available_to(tree, w.queue, w.model, usage)
    lend = max(0, avail - free)
    parts = [f"needs {_gpus(w.gpus)}: {free} free in quota {w.queue}"]
    node = tree.node(w.queue)
    if node.parent is None:
        parts.append("no cohort to borrow from")
    else:
        limit = "" if q.borrowing_limit is None else f" (borrowing limit {q.borrowing_limit})"
        parts.append(f"cohort can lend {lend}{limit}")
        already = borrowed(tree, w.queue, w.model, usage)
        if q.borrowing_limit is not None and already:
            parts.append(f"already borrowing {already}")
    if w.gpus > q.nominal + (q.borrowing_limit if q.borrowing_limit is not None else 10**18):
        parts.append("more than the queue may ever hold")
    return ", ".join(parts)


def _queue_order(w: Workload):
    return (-w.priority, w.submitted_at, w.id)


def queue_order(w: Workload):
    """The order of a pool's waiting line: highest priority first, then oldest."""
    return _queue_order(w)


def used_by(usage: Usage, queue: str, model: str) -> int:
    """GPUs of `model` a queue uses in `usage`."""
    return _get(usage, queue, model)


def with_usage(usage: Usage, queue: str, model: str, gpus: int) -> dict[str, dict[str, int]]:
    """A copy of `usage` in which `queue` uses `gpus` more GPUs of `model`."""
    return _add(usage, queue, model, gpus)


def admit(tree: QuotaTree, usage: Usage, pending: Iterable[Workload]) -> Admission:
    """Admit what fits, all-or-nothing per workload.

    Priority levels are served highest first.  Within a level each queue offers its oldest
    undecided workload (FIFO; a head that does not fit waits and the next one is offered).
    Heads that fit within their queue's nominal go first, oldest first; then heads that must
    borrow, the queue with the smallest dominant share (usage / nominal, max over models)
    first, then oldest.  Usage only grows during a pass, so a workload that does not fit
    when offered cannot fit later in the same pass.
    """
    current = {q: dict(m) for q, m in usage.items()}
    todo = sorted(set(pending), key=_queue_order)
    admitted: list[tuple[Workload, int]] = []
    waiting: list[tuple[Workload, str]] = []
    for _, level in itertools.groupby(todo, key=lambda w: w.priority):
        queues: dict[str, list[Workload]] = {}
        for w in level:
            queues.setdefault(w.queue, []).append(w)
        while any(queues.values()):
            inside, borrowing = [], []
            for queue in sorted(queues):
                while queues[queue]:
                    head = queues[queue][0]
                    valid = (head.gpus > 0 and head.queue in tree
                             and tree.is_queue(head.queue))
                    if valid and head.gpus <= available_to(tree, head.queue, head.model,
                                                           current):
                        break
                    queues[queue].pop(0)
                    reason = (f"needs {_gpus(head.gpus)}: a workload must ask for at least one"
                              if head.gpus <= 0 else waiting_reason(tree, head, current))
                    waiting.append((head, reason))
                if not queues[queue]:
                    continue
                head = queues[queue][0]
                free = tree.nominal(queue, head.model) - _get(current, queue, head.model)
                (inside if head.gpus <= free else borrowing).append(head)
            if inside:
                chosen = min(inside, key=lambda w: (w.submitted_at, w.id))
            elif borrowing:
                chosen = min(borrowing, key=lambda w: (dominant_share(tree, w.queue, current),
                                                       w.submitted_at, w.id))
            else:
                break
            queues[chosen.queue].pop(0)
            before = borrowed(tree, chosen.queue, chosen.model, current)
            current = _add(current, chosen.queue, chosen.model, chosen.gpus)
            after = borrowed(tree, chosen.queue, chosen.model, current)
            admitted.append((chosen, after - before))
    return Admission(tuple(admitted), tuple(waiting), current)


def usage_of(leases: Iterable[RunningLease]) -> dict[str, dict[str, int]]:
    """Usage (queue → model → GPUs) of a set of running leases."""
    out: dict[str, dict[str, int]] = {}
    for lease in leases:
        out.setdefault(lease.queue, {})
        out[lease.queue][lease.model] = out[lease.queue].get(lease.model, 0) + lease.gpus
    return out


def _victim_order(lease: RunningLease):
    return (lease.priority, -lease.started_at, lease.id)


def _minimise(chosen: list[RunningLease], still_enough) -> list[RunningLease]:
    """Give back, latest choice first, every chosen lease not needed (Kueue's fill-back)."""
    kept = list(chosen)
    for lease in reversed(chosen[:-1]):
        trial = [x for x in kept if x.id != lease.id]
        if still_enough(trial):
            kept = trial
    return kept


def reclaim(tree: QuotaTree, usage: Usage | None, running: Sequence[RunningLease],
            request: Workload) -> list[str]:
    """Lease ids to preempt so that ``request`` fits; [] when it fits already or cannot.

    Candidates, in this order:
    1. when the request keeps its queue within its nominal quota: leases of *other* queues of
       the same model whose queue is borrowing (uses more than its nominal) at the moment
       the lease is considered, lowest priority first, then most recently started;
    2. when the queue's policy says ``preempt_within_queue``: leases of the same queue with
       a lower priority than the request, in the same order.
    Candidates are taken until the request fits; then every chosen lease whose return would
    still leave enough room is given back (latest choice first).  The result is minimal: no
    single lease in it can be spared.  ``usage`` defaults to the usage of ``running``.
    """
    w = request
    base = {q: dict(m) for q, m in (usage if usage is not None else usage_of(running)).items()}

    def fits(victims: Iterable[RunningLease]) -> bool:
        cur = base
        for v in victims:
            cur = _add(cur, v.queue, v.model, -v.gpus)
        return w.gpus <= available_to(tree, w.queue, w.model, cur)

    if w.queue not in tree or not tree.is_queue(w.queue):
        return []
    if fits([]):
        return []
    same_model = sorted((r for r in running if r.model == w.model), key=_victim_order)
    chosen: list[RunningLease] = []
    cur = base
    within_nominal = _get(base, w.queue, w.model) + w.gpus <= tree.nominal(w.queue, w.model)
    if within_nominal:
        root = tree.root(w.queue)
        for lease in same_model:
            if lease.queue == w.queue or lease.queue not in tree:
                continue
            if tree.root(lease.queue) != root:
                continue
            if _get(cur, lease.queue, lease.model) <= tree.nominal(lease.queue, lease.model):
                continue  # that queue is no longer borrowing
            chosen.append(lease)
            cur = _add(cur, lease.queue, lease.model, -lease.gpus)
            if fits(chosen):
                return [x.id for x in _minimise(chosen, fits)]
    if tree.node(w.queue).preempt_within_queue:
        for lease in same_model:
            if lease.queue != w.queue or lease.priority >= w.priority:
                continue
            chosen.append(lease)
            if fits(chosen):
                return [x.id for x in _minimise(chosen, fits)]
    return []


# -- tidal schedules -------------------------------------------------------------------------
@dataclass(frozen=True)
class TidalSchedule:
    """Nominal quotas that change with the time of day.

    ``entries`` are ``(time, {queue: {model: nominal}})``; ``time`` is anything ordered (e.g.
    seconds since midnight).  At time ``t`` the last entry with ``time <= t`` applies; before
    the first entry the last one applies (the schedule wraps around the day).
    """

    entries: tuple[tuple[float, Mapping[str, Mapping[str, int]]], ...]

    def __init__(self, entries: Iterable[tuple[float, Mapping[str, Mapping[str, int]]]]):
        ordered = tuple(sorted(((t, n) for t, n in entries), key=lambda e: e[0]))
        if not ordered:
            raise QuotaError("a tidal schedule needs at least one entry")
        if len({t for t, _ in ordered}) != len(ordered):
            raise QuotaError("two tidal entries at the same time")
        object.__setattr__(self, "entries", ordered)

    def nominals_at(self, at: float) -> Mapping[str, Mapping[str, int]]:
        current = self.entries[-1][1]
        for t, nominals in self.entries:
            if t <= at:
                current = nominals
        return current


@dataclass(frozen=True)
class ScheduleChange:
    tree: QuotaTree = field(hash=False)
    excess: tuple[tuple[str, str, int], ...]  # (queue, model, GPUs that must give way)


def apply_schedule(tree: QuotaTree, schedule: TidalSchedule, at: float,
                   usage: Usage | None = None) -> ScheduleChange:
    """The tree in force at ``at`` and the GPUs that must give way.

    A queue whose new nominal is below its usage must give back the difference: the point of
    a tidal schedule is to hand that capacity to the queue whose nominal grew.  Queues not
    named by the schedule keep their nominal.
    """
    new_tree = tree.with_nominals(schedule.nominals_at(at))
    excess = []
    for queue, models in sorted((usage or {}).items()):
        if queue not in new_tree:
            continue
        for model, used in sorted(models.items()):
            over = used - new_tree.nominal(queue, model)
            if over > 0:
                excess.append((queue, model, over))
    return ScheduleChange(new_tree, tuple(excess))


def give_way(running: Sequence[RunningLease], excess: Iterable[tuple[str, str, int]]) -> list[str]:
    """Lease ids to preempt so that each (queue, model) frees at least its excess.

    Per (queue, model): lowest priority first, then most recently started, until enough is
    freed; then chosen leases not needed are given back (latest choice first).
    """
    out: list[str] = []
    for queue, model, gpus in excess:
        if gpus <= 0:
            continue
        pool = sorted((r for r in running if r.queue == queue and r.model == model),
                      key=_victim_order)
        chosen: list[RunningLease] = []
        for lease in pool:
            chosen.append(lease)
            if sum(x.gpus for x in chosen) >= gpus:
                break
        kept = _minimise(chosen, lambda c, need=gpus: sum(x.gpus for x in c) >= need)
        out.extend(x.id for x in kept)
    return out


# -- shaped guarantees (HiveD-style cells) ---------------------------------------------------
def _exact(leaves_free: Mapping[str, int], shapes: Mapping[str, int]) -> dict[str, str] | None:
    """An assignment quota → leaf placing every shape at once, or None (exact search)."""
    order = sorted((q for q in shapes if shapes[q] > 0), key=lambda q: (-shapes[q], q))
    free = {leaf: int(n) for leaf, n in sorted(leaves_free.items())}

    def search(i: int, acc: dict[str, str]) -> dict[str, str] | None:
        if i == len(order):
            return acc
        quota = order[i]
        need = shapes[quota]
        tried = set()
        for leaf in sorted(free, key=lambda x: (free[x] - need, x)):  # best fit first
            if free[leaf] < need or free[leaf] in tried:
                continue
            tried.add(free[leaf])  # leaves with equal free space are interchangeable
            free[leaf] -= need
            found = search(i + 1, {**acc, quota: leaf})
            free[leaf] += need
            if found is not None:
                return found
        return None

    return search(0, {})


def reserve_cells(leaves_free: Mapping[str, int],
                  shapes: Mapping[str, int]) -> dict[str, str | None]:
    """Reserve, for each quota, one leaf that can hold its shape (whole nodes in one leaf).

    ``leaves_free`` maps leaf → free whole nodes; ``shapes`` maps quota → whole nodes it is
    guaranteed inside one leaf.  Several shapes may share a leaf when it is large enough.
    The search is exact (backtracking, largest shape first, best-fit leaf first), so when
    every shape can be placed at once, every quota gets a leaf.  Otherwise shapes are kept
    largest first while the kept set stays placeable, and the others map to ``None``.
    Deterministic.
    """
    full = _exact(leaves_free, shapes)
    if full is None:
        kept: dict[str, int] = {}
        for quota in sorted(shapes, key=lambda q: (-shapes[q], q)):
            if _exact(leaves_free, {**kept, quota: shapes[quota]}) is not None:
                kept[quota] = shapes[quota]
        full = _exact(leaves_free, kept) or {}
    return {quota: full.get(quota) for quota in sorted(shapes)}


def is_placeable(leaves_free: Mapping[str, int], shapes: Mapping[str, int]) -> bool:
    """Whether every shape can be placed at once."""
    return _exact(leaves_free, shapes) is not None


def may_take(leaves_free: Mapping[str, int], shapes: Mapping[str, int], leaf: str,
             nodes: int) -> bool:
    """Whether a lease may take ``nodes`` whole nodes from ``leaf`` and keep shapes placeable.

    The placement filter: a small lease that would break a reserved cell is filtered away.
    """
    if leaves_free.get(leaf, 0) < nodes:
        return False
    after = dict(leaves_free)
    after[leaf] -= nodes
    return is_placeable(after, shapes)

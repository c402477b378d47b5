"""The replay experiment: arrivals, one queue, departures (fill is in `fill.py`).

Replay is an event loop over arrivals (in submit order) and completions (a heap). After the
events of one instant, the queue is served FIFO; when its head does not fit, EASY backfill
lets a later job start if that does not delay the head. The head's reservation (shadow time)
is the earliest completion after which it fits, counting GPUs of its models: on one node for
a job that must sit on one node (that node is then reserved), else anywhere. A later job may
start now if it ends by then, or if it takes only GPUs the head will not need at that time
(spare GPUs, or GPUs off the reserved node). CPU and memory are not reserved: a head held
back only by them may be passed by jobs that take them. Durations are known exactly (the trace's run times stand for estimates).
Only the first `backfill_depth` waiting jobs behind the head are scanned at each instant, so
a long queue costs a bounded amount of work per event.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.simulate.cluster import Cluster
from scheduler.simulate.metrics import fewest_leaves, leaves_spanned, mean, percentile
from scheduler.simulate.metrics import locality as locality_of
from scheduler.simulate.policies import Policy
from scheduler.simulate.state import Allocation, ClusterState, fits_empty_cluster
from scheduler.simulate.workload import WHOLE, Job

DEFAULT_BACKFILL_DEPTH = 100
DEFAULT_SAMPLES = 500


@dataclass
class Started:
    job: Job
    start_s: float
    allocation: Allocation

    @property
    def end_s(self) -> float:
        return self.start_s + self.job.duration_s


@dataclass
class Reservation:
    """The head of the queue starts at `at_s`. A job that runs past it may take, of the GPUs
    the head could use, `spare` GPUs anywhere (a head that may span nodes) or, for a head that
    must sit on one node, any GPUs but those of the reserved `node` beyond `node_spare`, or,
    for a head held for a compact shape, any GPUs off the `blocked` nodes."""

    at_s: float
    spare: int
    node: str | None = None
    node_spare: int = 0
    # a head held for a compact shape: the nodes of the leaves it waits for, kept from jobs
    # that would run past `at_s` (the rest of the cluster stays open to them)
    blocked: frozenset[str] | None = None

    def allows(self, allocation: Allocation) -> bool:
        if self.blocked is not None:
            return not self.blocked & set(allocation.whole)
        if self.node is None:
            if allocation.opened_gpus > self.spare:
                return False
            self.spare -= allocation.opened_gpus
            return True
        on_node = allocation.whole.get(self.node, 0)
        if allocation.shared is not None and allocation.shared.node == self.node:
            on_node += 1 if allocation.shared.slot is None else 0
        if on_node > self.node_spare:
            return False
        self.node_spare -= on_node
        return True


@dataclass
class Timeline:
    """The cluster sampled at regular instants: for the plot and the fragmentation measure."""

    t_s: list[float] = field(default_factory=list)
    busy_gpus: list[float] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)


class Replay:
    def __init__(self, cluster: Cluster, jobs: Sequence[Job], policy: Policy,
                 backfill_depth: int = DEFAULT_BACKFILL_DEPTH,
                 samples: int = DEFAULT_SAMPLES, locality: str = "pod",
                 compact_slack: int | None = None, compact_patience_s: float = 0.0) -> None:
        """`compact_slack`: a job spanning nodes starts only on at most that many leaves
        more than the fewest the empty cluster allows, unless it has been held
        `compact_patience_s` since it could first have started spread (None: it starts
        wherever the policy puts it)."""
        self.cluster = cluster
        self.compact_slack = compact_slack
        self.compact_patience_s = compact_patience_s
        self.now = 0.0
        self._fewest: dict[tuple, int] = {}
        self._held_since: dict[int, float] = {}  # by job position
        self._held_now: int | None = None  # the job last held for a compact shape
        self.jobs = sorted(jobs, key=lambda job: (job.submit_s, job.position))
        self.policy = policy
        self.backfill_depth = backfill_depth
        self.state = ClusterState(cluster, locality)
        self.queue: list[Job] = []
        self.started: dict[int, Started] = {}  # by sequence number
        self.completions: list[tuple[float, int]] = []  # heap of (end, sequence)
        self.by_end: list[tuple[float, int]] = []  # the same, kept sorted for reservations
        self.finished: list[Started] = []
        self.refused: list[Job] = []  # could never run on this cluster
        self.timeline = Timeline()
        self._samples = samples
        self._sequence = 0
        self._fragmentation_at: tuple[int, float] = (-1, 0.0)
        # The start each blocked head was first promised, by job position: backfill must
        # never make a head start later than that (checked by the tests).
        self.promised_start: dict[int, float] = {}

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> Replay:
        jobs, arrived = self.jobs, 0
        first = jobs[0].submit_s
        horizon = max(job.submit_s + job.duration_s for job in jobs) - first
        interval = max(horizon / self._samples, 1e-9)
        next_sample = first
        while arrived < len(jobs) or self.completions:
            now = min(jobs[arrived].submit_s if arrived < len(jobs) else math.inf,
                      self.completions[0][0] if self.completions else math.inf)
            while next_sample < now:  # the state since the last instant holds until now
                self.sample(next_sample)
                next_sample += interval
            while self.completions and self.completions[0][0] <= now:
                self.finish(heapq.heappop(self.completions)[1])
            while arrived < len(jobs) and jobs[arrived].submit_s <= now:
                self.arrive(jobs[arrived])
                arrived += 1
            self.schedule(now)
        self.sample(next_sample)
        return self

    def arrive(self, job: Job) -> None:
        if fits_empty_cluster(self.cluster, job):
            self.queue.append(job)
        else:
            self.refused.append(job)

    def schedule(self, now: float) -> None:
        self.now = now
        while self.queue:
            allocation = self.try_place(self.queue[0])
            if allocation is None:
                break
            self.start(self.queue.pop(0), allocation, now)
        if len(self.queue) > 1 and self.backfill_depth > 0:
            self.backfill(now)

    def backfill(self, now: float) -> None:
        head = self.queue[0]
        reservation = self.reservation(head, now)
        self.promised_start.setdefault(head.position, reservation.at_s)
        started = []
        for position in range(1, min(len(self.queue), self.backfill_depth + 1)):
            job = self.queue[position]
            ends_in_time = now + job.duration_s <= reservation.at_s
            bound = not ends_in_time and competes_with(head, job)
            if (bound and reservation.node is None and reservation.blocked is None
                    and job.whole_gpus > reservation.spare):
                continue  # cheap refusal before asking the policy
            allocation = self.try_place(job)
            if allocation is not None and bound and not reservation.allows(allocation):
                allocation = self.place_off_reserved_node(job, reservation)
            if allocation is None:
                continue
            self.start(job, allocation, now)
            started.append(position)
        for position in reversed(started):
            del self.queue[position]

    def reservation(self, head: Job, now: float) -> Reservation:
        """When the head can start, counting GPUs, and what others may take meanwhile."""
        if self._held_now == head.position:
            held = self.compact_reservation(head)
            if held is not None:
                return held
        if head.gpus == 0:
            # A CPU-only head waits for CPU or memory; hold the next completion for it.
            return Reservation(self.by_end[0][0] if self.by_end else now, 0)
        need = max(head.whole_gpus, 1)
        if self.state.single_node(head):
            reserved = self.node_reservation(head, need)
            if reserved is not None:
                return reserved
        free = self.state.free_whole(head.gpu_models)
        if free >= need:  # blocked by CPU, memory or shares, not by GPU count
            return Reservation(now, free - need)
        for end_s, sequence in self.by_end:
            free += gpus_of_models(self.state, self.started[sequence].allocation,
                                   head.gpu_models)
            if free >= need:
                return Reservation(end_s, free - need)
        return Reservation(math.inf, 0)

    def node_reservation(self, head: Job, need: int) -> Reservation | None:
        """For a head that must sit on one node: the first node to have `need` GPUs free as
        running jobs end. None when some node has them already (the head waits for CPU,
        memory or shares), or never will."""
        state = self.state
        if any(state.index.free_gpus(name) >= need for name in state.order
               if state.model_ok(name, head)):
            return None
        freed: dict[str, int] = {}
        for end_s, sequence in self.by_end:
            for name, gpus in self.started[sequence].allocation.whole.items():
                if not state.model_ok(name, head):
                    continue
                freed[name] = freed.get(name, 0) + gpus
                free_then = state.index.free_gpus(name) + freed[name]
                if free_then >= need:
                    return Reservation(end_s, 0, node=name, node_spare=free_then - need)
        return None

    def compact_reservation(self, head: Job) -> Reservation | None:
        """For a head held for a compact shape: the first instant, as running jobs end, when
        its fewest leaves (plus the slack) have its GPUs free, with those leaves' nodes kept
        from jobs that would still run then. None when no such instant comes."""
        state, cluster = self.state, self.cluster
        allowed = self._fewest[(head.gpus, head.gpu_models)] + (self.compact_slack or 0)
        leaf_of = {name: cluster.snapshot.domain_of(name, "leaf") for name in state.order
                   if state.model_ok(name, head)}
        free: dict[str, int] = {}
        for name, leaf in leaf_of.items():
            free[leaf] = free.get(leaf, 0) + state.index.free_gpus(name)
        for end_s, sequence in self.by_end:
            for name, gpus in self.started[sequence].allocation.whole.items():
                if name in leaf_of:
                    free[leaf_of[name]] += gpus
            best = sorted(free, key=lambda leaf: (-free[leaf], leaf))[:allowed]
            if sum(free[leaf] for leaf in best) >= head.whole_gpus:
                leaves = set(best)
                return Reservation(end_s, 0, blocked=frozenset(
                    name for name, leaf in leaf_of.items() if leaf in leaves))
        return None

    def place_off_reserved_node(self, job: Job, reservation: Reservation) -> Allocation | None:
        """Ask the policy again with the reserved node's GPUs (beyond its spare), or the
        blocked nodes' GPUs, held back."""
        if reservation.blocked is not None:
            with self.state.withholding({name: self.state.index.free_gpus(name)
                                         for name in reservation.blocked}):
                allocation = self.try_place(job)
            if allocation is None or not reservation.allows(allocation):
                return None
            return allocation
        if reservation.node is None:
            return None
        held = self.state.index.free_gpus(reservation.node) - reservation.node_spare
        with self.state.withholding({reservation.node: held}):
            allocation = self.try_place(job)
        if allocation is None or not reservation.allows(allocation):
            return None
        return allocation

    def try_place(self, job: Job) -> Allocation | None:
        if job.whole_gpus > self.state.free_whole(job.gpu_models):
            return None  # not enough free GPUs anywhere: skip the policy
        allocation = self.policy.place(self.state, job)
        if allocation is not None and self.too_spread(job, allocation):
            return None  # held for a compact shape (the reservation keeps the GPUs coming)
        return allocation

    def too_spread(self, job: Job, allocation: Allocation) -> bool:
        """A job spanning nodes placed on more leaves than `compact_slack` over its fewest,
        while it may still wait."""
        if self.compact_slack is None or len(allocation.whole) < 2:
            return False
        key = (job.gpus, job.gpu_models)
        if key not in self._fewest:
            self._fewest[key] = fewest_leaves(self.cluster, job)
        if leaves_spanned(self.cluster, list(allocation.whole)) <= \
                self._fewest[key] + self.compact_slack:
            return False
        # patience counts from the first time it could have started spread
        since = self._held_since.setdefault(job.position, self.now)
        if self.now - since >= self.compact_patience_s:
            return False
        self._held_now = job.position
        return True

    def start(self, job: Job, allocation: Allocation, now: float) -> None:
        allocation = self.state.take(allocation)
        self._sequence += 1
        self.started[self._sequence] = Started(job, now, allocation)
        key = (now + job.duration_s, self._sequence)
        heapq.heappush(self.completions, key)
        bisect.insort(self.by_end, key)

    def finish(self, sequence: int) -> None:
        record = self.started.pop(sequence)
        self.state.give_back(record.allocation)
        key = (record.end_s, sequence)
        del self.by_end[bisect.bisect_left(self.by_end, key)]
        self.finished.append(record)

    def sample(self, at: float) -> None:
        version, value = self._fragmentation_at
        if version != self.state.version:
            value = self.state.fragmentation()
            self._fragmentation_at = (self.state.version, value)
        self.timeline.t_s.append(at)
        self.timeline.busy_gpus.append(self.state.allocated_milli / WHOLE)
        self.timeline.queue.append(len(self.queue))
        self.timeline.fragmentation.append(value)

    # --- results -----------------------------------------------------------------------

    def results(self) -> dict:
        done = self.finished
        waits = [record.start_s - record.job.submit_s for record in done]
        completion = [record.end_s - record.job.submit_s for record in done]
        busy = sum(record.job.gpu_demand * record.job.duration_s for record in done)
        first = self.jobs[0].submit_s
        last = max((record.end_s for record in done), default=first)
        span = last - first
        capacity = self.cluster.total_gpus * span
        placed = [(record.job, record.allocation.nodes) for record in done if record.job.gpus]
        frag = self.timeline.fragmentation
        return {
            "jobs": {"total": len(self.jobs), "completed": len(done),
                     "refused": len(self.refused)},
            "span_s": span,
            "busy_gpu_s": busy,
            "utilization": busy / capacity if capacity else None,
            "wait_s": {"mean": mean(waits), "p50": percentile(waits, 0.5),
                       "p95": percentile(waits, 0.95)},
            "jct_s": {"mean": mean(completion)},
            "locality": locality_of(self.cluster, placed),
            "fragmentation": {
                "mean": mean(frag),
                "series": [[t, f] for t, f in zip(self.timeline.t_s, frag, strict=True)],
            },
            "queue": {"max": max(self.timeline.queue, default=0)},
            "timeline": {
                "t_s": self.timeline.t_s,
                "busy_gpus": self.timeline.busy_gpus,
                "queue": self.timeline.queue,
            },
        }


def competes_with(head: Job, job: Job) -> bool:
    """Could `job` take GPUs the head is waiting for? Not if their GPU models differ."""
    if job.gpus == 0:
        return False
    if head.gpu_models is None or job.gpu_models is None:
        return True
    return bool(head.gpu_models & job.gpu_models)


def gpus_of_models(state: ClusterState, allocation: Allocation,
                   models: frozenset[str] | None) -> int:
    """Whole GPUs an allocation gives back that are of `models` (shares give back none for
    sure: the GPU is whole again only when its last share leaves)."""
    if models is None:
        return sum(allocation.whole.values())
    return sum(gpus for name, gpus in allocation.whole.items()
               if state.nodes[name].gpu_model in models)

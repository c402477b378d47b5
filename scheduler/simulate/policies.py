"""Placement policies: ours (`best_fit`) and the baselines `first_fit` and `random`.

Every policy answers `place(state, job) -> Allocation | None` without changing the state.
All of them follow the same locality rule (`ClusterState.locality`: by default a job that one
node could hold must run on one node; larger jobs are split over nodes), so they differ only
in *where* they put jobs, and through that in what fits later.

- `best_fit` (ours): whole GPUs from the placement engine: `Request(gpus, required="node")`
  for a job that must sit on one node (the tightest node), else `preferred="node"`: the
  narrowest level (node, leaf, spine, fabric) with a domain that holds the job, best fit
  inside it. A share of a GPU goes where the pool's fragmentation against the workload's own
  mix of requests grows least (`choose_shared_gpu`, after FGD), among the open shared GPUs and
  the free GPU the engine would pick. A CPU-only job goes where it strands the fewest GPUs.
  With the workload's demands (the default), a job one node holds goes where the pool's
  fragmentation against them grows least, CPU and memory counted (`BestFit`).
- `first_fit`: nodes in file order, ignoring topology: the first node that holds the job, else
  (if it may span nodes) GPUs gathered from nodes in file order; shares on the first GPU
  with room.
- `random`: a random node that holds the job (seeded), else (if it may span nodes) GPUs
  gathered from nodes in a random order; shares on a random GPU with room.
"""

from __future__ import annotations

import heapq
import random
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence

from scheduler.core.placement import MixItem, Request, SharedGpu, SharedRequest, choose_shared_gpu
from scheduler.core.placement.fgd import Demand, FragmentationScorer, NodeFree, mix_of
from scheduler.simulate.state import Allocation, ClusterState, SharedSlot
from scheduler.simulate.workload import WHOLE, Job


class Policy(ABC):
    """A placement policy: whole GPUs, a share of one GPU, or a job that needs no GPU."""

    name = ""

    def place(self, state: ClusterState, job: Job) -> Allocation | None:
        if job.gpus == 0:
            return self.place_host_only(state, job)
        if job.is_shared:
            return self.place_share(state, job)
        return self.place_whole(state, job)

    @abstractmethod
    def place_whole(self, state: ClusterState, job: Job) -> Allocation | None: ...

    @abstractmethod
    def place_share(self, state: ClusterState, job: Job) -> Allocation | None: ...

    @abstractmethod
    def place_host_only(self, state: ClusterState, job: Job) -> Allocation | None: ...


def gather(state: ClusterState, job: Job, names: Sequence[str]) -> Allocation | None:
    """The first node of `names` that holds the whole job, else GPUs taken in that order."""
    usable = {name: state.usable_gpus(name, job) for name in names}
    for name in names:
        if usable[name] >= job.gpus:
            return state.whole_allocation(job, {name: job.gpus})
    if state.single_node(job):
        return None
    whole: dict[str, int] = {}
    remaining = job.gpus
    for name in names:
        take = min(usable[name], remaining)
        if take:
            whole[name] = take
            remaining -= take
        if not remaining:
            return state.whole_allocation(job, whole)
    return None


def share_candidates(state: ClusterState, job: Job, names: Sequence[str]) -> list[SharedSlot]:
    """Every GPU that could take the share, node by node in `names` order: open shared
    GPUs first, then one wholly free GPU of the node."""
    out = []
    for name in names:
        if not state.model_ok(name, job) or not state.host_fits(name, job):
            continue
        out.extend(SharedSlot(name, slot, job.gpu_milli) for slot, _ in state.open_slots(name, job))
        if state.index.free_gpus(name):
            out.append(SharedSlot(name, None, job.gpu_milli))
    return out


class FirstFit(Policy):
    name = "first_fit"

    def place_whole(self, state: ClusterState, job: Job) -> Allocation | None:
        return gather(state, job, state.order)

    def place_share(self, state: ClusterState, job: Job) -> Allocation | None:
        for name in state.order:
            candidates = share_candidates(state, job, [name])
            if candidates:
                return state.host_allocation(job, name, candidates[0])
        return None

    def place_host_only(self, state: ClusterState, job: Job) -> Allocation | None:
        for name in state.order:
            if state.host_fits(name, job):
                return state.host_allocation(job, name)
        return None


class RandomFit(Policy):
    name = "random"

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"{seed}:random-policy")  # apart from the workload draws

    def place_whole(self, state: ClusterState, job: Job) -> Allocation | None:
        holding = [name for name in state.order if state.usable_gpus(name, job) >= job.gpus]
        if holding:
            return state.whole_allocation(job, {self.rng.choice(holding): job.gpus})
        if state.single_node(job):
            return None
        names = list(state.order)
        self.rng.shuffle(names)
        return gather(state, job, names)

    def place_share(self, state: ClusterState, job: Job) -> Allocation | None:
        candidates = share_candidates(state, job, state.order)
        if not candidates:
            return None
        choice = self.rng.choice(candidates)
        return state.host_allocation(job, choice.node, choice)

    def place_host_only(self, state: ClusterState, job: Job) -> Allocation | None:
        fitting = [name for name in state.order if state.host_fits(name, job)]
        return state.host_allocation(job, self.rng.choice(fitting)) if fitting else None


class BestFit(Policy):
    """`demands` given (the default through `make_policy`): a job one node holds goes where
    the cluster's fragmentation against the workload's mix grows least (FGD,
    `scheduler.core.placement.fgd`, which also counts the GPUs a node's CPU and memory cannot
    back: per copy of each request, and at the mix's CPU per GPU), best fit breaking ties;
    a larger job keeps the engine's
    compact placement, so locality is never traded for fragmentation. Without `demands`:
    the engine's tightest node, FGD only for the GPU a share goes on (the earlier policy,
    kept as the baseline of `bench/openb_bench.py`)."""

    name = "best_fit"

    def __init__(self, mix: Sequence[MixItem], demands: Sequence[Demand] = ()) -> None:
        self.mix = tuple(mix)
        self.scorer = FragmentationScorer(demands) if demands else None
        self._nodes: dict[str, tuple[int, NodeFree, tuple[int | None, ...]]] = {}
        self._groups: NodeGroups | None = None

    def place_whole(self, state: ClusterState, job: Job) -> Allocation | None:
        if state.single_node(job):
            if self.scorer is not None:
                choice = self.scorer.choose(self.candidates(state, job), demand_of(job))
                return None if choice is None else state.whole_allocation(
                    job, {choice.node: job.gpus})
            request = Request(gpus=job.gpus, required="node", gpu_models=job.gpu_models)
        else:
            request = Request(gpus=job.gpus, preferred="node", gpu_models=job.gpu_models)
        whole = state.place_with_engine(job, request)
        return None if whole is None else state.whole_allocation(job, whole)

    def place_share(self, state: ClusterState, job: Job) -> Allocation | None:
        if self.scorer is not None:
            choice = self.scorer.choose(self.candidates(state, job), demand_of(job))
            if choice is None:
                return None
            slot = self.node_free(state, choice.node)[1][choice.gpu]
            return state.host_allocation(job, choice.node,
                                         SharedSlot(choice.node, slot, job.gpu_milli))
        candidates: dict[str, SharedSlot] = {}
        gpus: list[SharedGpu] = []
        for name in state.order:
            if state.slots[name] and state.model_ok(name, job) and state.host_fits(name, job):
                for slot, free in state.open_slots(name, job):
                    candidates[f"{name}/{slot}"] = SharedSlot(name, slot, job.gpu_milli)
                    gpus.append(SharedGpu(f"{name}/{slot}", free, 0))
        fresh = self.fresh_gpu_node(state, job)
        if fresh is not None:
            candidates[f"{fresh}/new"] = SharedSlot(fresh, None, job.gpu_milli)
            gpus.append(SharedGpu(f"{fresh}/new", WHOLE, 0))
        chosen = choose_shared_gpu(gpus, SharedRequest(job.gpu_milli, 0), self.mix)
        if chosen is None:
            return None
        slot = candidates[chosen]
        return state.host_allocation(job, slot.node, slot)

    def fresh_gpu_node(self, state: ClusterState, job: Job) -> str | None:
        """The node whose free GPU the engine would give a one-GPU job (the tightest)."""
        host_only = Job(job.name, job.submit_s, job.duration_s, gpus=1,
                        gpu_models=job.gpu_models, cpu_milli=job.cpu_milli,
                        memory_mib=job.memory_mib)
        whole = state.place_with_engine(host_only, Request(gpus=1, gpu_models=job.gpu_models))
        return None if whole is None else next(iter(whole))

    def place_host_only(self, state: ClusterState, job: Job) -> Allocation | None:
        """Where the fewest free GPUs are left without CPU or memory: nodes with no free GPU
        first (a CPU node, or a GPU node already full), then the tightest fit on CPU. With
        a mix: where fragmentation grows least (taking CPU or memory a GPU request needs
        strands that node's GPUs), then the same order."""
        if self.scorer is not None:
            choice = self.scorer.choose(self.candidates(state, job), demand_of(job))
            return None if choice is None else state.host_allocation(job, choice.node)
        fitting = [name for name in state.order if state.host_fits(name, job)]
        if not fitting:
            return None
        position = {name: i for i, name in enumerate(state.order)}

        def key(name: str) -> tuple:
            return (state.index.free_gpus(name), state.free_cpu[name] - job.cpu_milli,
                    state.free_memory[name] - job.memory_mib, position[name])

        return state.host_allocation(job, min(fitting, key=key))

    def candidates(self, state: ClusterState, job: Job) -> list[tuple[str, NodeFree]]:
        """One node per group of alike nodes of the job's GPU models, in file order, as the
        scorer sees it. The scorer breaks ties by the order it is given, so the group's
        first node is the one it would pick among them: its answer is the answer over every
        node, at the cost of one score per group."""
        if self._groups is None or self._groups.state is not state:
            self._groups = NodeGroups(state, self.node_free)
        return [(name, self.node_free(state, name)[0])
                for name in self._groups.representatives()
                if job.gpus == 0 or state.model_ok(name, job)]

    def node_free(self, state: ClusterState, name: str) -> tuple[NodeFree, tuple[int | None, ...]]:
        """The node's free GPUs (whole ones, then open shared slots), CPU and memory, and the
        slot behind each GPU position (None: a wholly free GPU); kept until the node changes."""
        version = state.node_version[name]
        cached = self._nodes.get(name)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        whole = state.index.free_gpus(name)
        slots = state.slots[name]
        node = NodeFree(state.nodes[name].gpu_model, (WHOLE,) * whole + tuple(slots.values()),
                        state.free_cpu[name], state.free_memory[name])
        positions = (None,) * whole + tuple(slots)
        self._nodes[name] = (version, node, positions)
        return node, positions


class NodeGroups:
    """The nodes of a `ClusterState` grouped by all the fragmentation scorer reads of them
    (GPU model, free compute per GPU, CPU and memory): nodes of one group score alike. Kept up
    to date from the nodes the state marks dirty, so a placement costs one score per group
    (a few dozen) rather than one per node (thousands)."""

    def __init__(self, state: ClusterState,
                 node_free: Callable[[ClusterState, str], tuple[NodeFree, tuple]]) -> None:
        self.state = state
        self.node_free = node_free
        self.position = {name: i for i, name in enumerate(state.order)}
        self.group_of: dict[str, tuple] = {}
        self.size: Counter = Counter()
        # per group, (file position, node) in a heap; entries of nodes that left are
        # dropped when they reach the top
        self.members: dict[tuple, list[tuple[int, str]]] = {}
        state.dirty.clear()
        for name in state.order:
            self.regroup(name)

    def regroup(self, name: str) -> None:
        node = self.node_free(self.state, name)[0]
        key = (node.gpu_model, tuple(sorted(node.gpus, reverse=True)), node.cpu_milli,
               node.memory_mib)
        old = self.group_of.get(name)
        if old == key:
            return
        if old is not None:
            self.size[old] -= 1
            if not self.size[old]:
                del self.size[old], self.members[old]
        self.group_of[name] = key
        self.size[key] += 1
        heapq.heappush(self.members.setdefault(key, []), (self.position[name], name))

    def representatives(self) -> list[str]:
        """The first node in file order of every group."""
        for name in self.state.dirty:
            self.regroup(name)
        self.state.dirty.clear()
        firsts = []
        for key, heap in self.members.items():
            while self.group_of[heap[0][1]] != key:
                heapq.heappop(heap)
            firsts.append(heap[0])
        return [name for _, name in sorted(firsts)]


def demand_of(job: Job, weight: float = 1.0) -> Demand:
    return Demand(job.gpus, job.gpu_milli if job.gpus else WHOLE, job.cpu_milli,
                  job.memory_mib, job.gpu_models, weight)


def workload_demands(jobs: Sequence[Job]) -> tuple[Demand, ...]:
    """The workload's own requests, by kind (GPUs, share, CPU, memory, models), weighted by
    how often each kind occurs: the mix the scorer keeps the cluster ready for."""
    return mix_of(demand_of(job) for job in jobs)


def workload_mix(jobs: Sequence[Job]) -> tuple[MixItem, ...]:
    """The requests the pool should stay ready for: the workload's own GPU demands by share
    of a GPU (a whole-GPU job, however many GPUs, needs wholly free GPUs)."""
    counts = Counter(job.gpu_milli if job.is_shared else WHOLE for job in jobs if job.gpus)
    total = sum(counts.values())
    return tuple(MixItem(milli, 0, count / total) for milli, count in sorted(counts.items()))


POLICY_NAMES = ("best_fit", "first_fit", "random")


def make_policy(name: str, seed: int, jobs: Sequence[Job]) -> Policy:
    if name == "best_fit":
        return BestFit(workload_mix(jobs), workload_demands(jobs))
    if name == "first_fit":
        return FirstFit()
    if name == "random":
        return RandomFit(seed)
    raise ValueError(f"unknown policy {name!r} (choose {', '.join(POLICY_NAMES)})")

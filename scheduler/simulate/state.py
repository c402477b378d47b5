"""What is free on the cluster while a simulation runs, on top of the placement engine's index.

The engine's `PlacementIndex` keeps whole free GPUs per node and per topology domain and
updates them incrementally (commit on start, release on finish). It knows nothing of CPU,
host memory or shares of a GPU, so this module keeps those beside it:

- CPU and memory per node. A job's `cpu_milli` / `memory_mib` are totals, split over its
  nodes in proportion to the GPUs it holds on each (rounded up). When a job asks for them,
  the GPUs a node could not back with CPU or memory are withheld from the index for the
  length of one placement (commit, place, release): the engine's own per-node filters read
  the static `Node.free_cpu_milli`, which cannot follow a running simulation.
- Shared GPUs. A share of a GPU (`gpu_milli` < 1000) takes a whole GPU out of the index the
  first time it is used and gives it back when its last share leaves. Such a GPU is a *slot*
  with free thousandths. The workload has no GPU-memory column, so a share gets the same
  share of the GPU's memory: GPU memory fits whenever the compute share fits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fabric.core.locality import ONE_FABRIC_WIDEST_FIRST
from scheduler.core.placement import Node, PlacementIndex, Request
from scheduler.simulate.cluster import Cluster, ClusterNode
from scheduler.simulate.workload import WHOLE, Job


@dataclass(frozen=True)
class SharedSlot:
    """A share of one GPU: `slot` is None when the share opens a wholly free GPU."""

    node: str
    slot: int | None
    milli: int


@dataclass(frozen=True)
class Allocation:
    whole: dict[str, int] = field(default_factory=dict)  # node -> whole GPUs
    shared: SharedSlot | None = None
    cpu: dict[str, int] = field(default_factory=dict)  # node -> CPU milli
    memory: dict[str, int] = field(default_factory=dict)  # node -> memory MiB

    @property
    def nodes(self) -> list[str]:
        names = [name for name, gpus in self.whole.items() if gpus]
        if self.shared is not None:
            names.append(self.shared.node)
        return names or list(self.cpu or self.memory)

    @property
    def opened_gpus(self) -> int:
        """Whole GPUs this allocation takes out of the pool (a new shared slot counts one)."""
        opened = 1 if self.shared is not None and self.shared.slot is None else 0
        return sum(self.whole.values()) + opened


LOCALITY_RULES = ("pod", "relaxed")


class ClusterState:
    """`locality="pod"`: a job that one node of its GPU models could hold must run on one
    node, as a Kubernetes pod does; larger jobs span nodes. `"relaxed"`: any job may be split
    over nodes when no single node holds it."""

    def __init__(self, cluster: Cluster, locality: str = "pod") -> None:
        if locality not in LOCALITY_RULES:
            raise ValueError(f"unknown locality rule {locality!r}")
        self.cluster = cluster
        self.locality = locality
        self._largest_node: dict[frozenset[str] | None, int] = {}
        self.nodes: dict[str, ClusterNode] = {node.name: node for node in cluster.nodes}
        self.order: list[str] = [node.name for node in cluster.nodes]  # file order
        self.index = PlacementIndex(ONE_FABRIC_WIDEST_FIRST, (engine_node(node) for node in cluster.nodes))
        self.free_cpu = {node.name: node.cpu_milli for node in cluster.nodes}
        self.free_memory = {node.name: node.memory_mib for node in cluster.nodes}
        self.slots: dict[str, dict[int, int]] = {node.name: {} for node in cluster.nodes}
        self._next_slot = 0
        self.total_gpus = cluster.total_gpus
        self.allocated_milli = 0  # GPUs in use, in thousandths
        self.version = 0  # changes whenever something is taken or given back
        # per node, so a policy can keep what it computed for the nodes nothing touched
        self.node_version = {node.name: 0 for node in cluster.nodes}
        # nodes changed since a policy last looked (`BestFit` regroups only these)
        self.dirty: set[str] = set()

    # --- questions -----------------------------------------------------------------

    def free_whole(self, models: frozenset[str] | None = None) -> int:
        free = self.index.root.free
        if models is None:
            return sum(free.values())
        return sum(free.get(model, 0) for model in models)

    def single_node(self, job: Job) -> bool:
        """Must this job's whole GPUs sit on one node?"""
        if job.gpus == 0 or job.is_shared:
            return True
        if self.locality != "pod":
            return False
        return job.gpus <= self.largest_node(job.gpu_models)

    def largest_node(self, models: frozenset[str] | None) -> int:
        if models not in self._largest_node:
            self._largest_node[models] = max(
                (node.gpus for node in self.cluster.nodes
                 if models is None or node.gpu_model in models), default=0)
        return self._largest_node[models]

    def model_ok(self, name: str, job: Job) -> bool:
        return job.gpu_models is None or self.nodes[name].gpu_model in job.gpu_models

    def usable_gpus(self, name: str, job: Job) -> int:
        """Whole GPUs this node could give `job`, counting its CPU and memory."""
        if not self.model_ok(name, job):
            return 0
        usable = self.index.free_gpus(name)
        if job.cpu_milli and job.gpus:
            usable = min(usable, self.free_cpu[name] * job.gpus // job.cpu_milli)
        if job.memory_mib and job.gpus:
            usable = min(usable, self.free_memory[name] * job.gpus // job.memory_mib)
        return usable

    def host_fits(self, name: str, job: Job) -> bool:
        """Room for all of the job's CPU and memory (a share or a CPU-only job)."""
        return self.free_cpu[name] >= job.cpu_milli and self.free_memory[name] >= job.memory_mib

    def open_slots(self, name: str, job: Job) -> Iterator[tuple[int, int]]:
        """(slot, free thousandths) of this node's shared GPUs with room for `job`."""
        for slot, free in self.slots[name].items():
            if free >= job.gpu_milli:
                yield slot, free

    @contextmanager
    def withholding(self, gpus: dict[str, int]) -> Iterator[None]:
        """Hide whole free GPUs of some nodes from every policy for a moment."""
        gpus = {name: count for name, count in gpus.items() if count > 0}
        self.index.commit(gpus)
        self._changed(gpus)  # a policy that remembers nodes must see them held back
        try:
            yield
        finally:
            self.index.release(gpus)
            self._changed(gpus)

    def place_with_engine(self, job: Job, request: Request) -> dict[str, int] | None:
        """The engine's answer, with GPUs that CPU or memory cannot back withheld."""
        withheld: dict[str, int] = {}
        if job.cpu_milli or job.memory_mib:
            for name in self.order:
                if not self.model_ok(name, job):
                    continue  # the engine's GPU-model filter excludes it already
                free = self.index.free_gpus(name)
                usable = self.usable_gpus(name, job)
                if usable < free:
                    withheld[name] = free - usable
        with self.withholding(withheld):
            placement = self.index.place(request)
        return dict(placement.assignment) if placement.placed else None

    # --- taking and giving back ------------------------------------------------------

    def host_shares(self, job: Job, whole: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        """CPU and memory per node for a whole-GPU allocation, in proportion to its GPUs."""
        cpu = {n: math.ceil(job.cpu_milli * g / job.gpus) for n, g in whole.items()
               if job.cpu_milli}
        memory = {n: math.ceil(job.memory_mib * g / job.gpus) for n, g in whole.items()
                  if job.memory_mib}
        return cpu, memory

    def whole_allocation(self, job: Job, whole: dict[str, int]) -> Allocation:
        cpu, memory = self.host_shares(job, whole)
        return Allocation(whole=whole, cpu=cpu, memory=memory)

    def host_allocation(self, job: Job, name: str, shared: SharedSlot | None = None) -> Allocation:
        """A share of a GPU or a CPU-only job: all its CPU and memory on one node."""
        cpu = {name: job.cpu_milli} if job.cpu_milli else {}
        memory = {name: job.memory_mib} if job.memory_mib else {}
        if not cpu and not memory and shared is None:
            cpu = {name: 0}  # remember the node of a job that asks for nothing
        return Allocation(shared=shared, cpu=cpu, memory=memory)

    def take(self, allocation: Allocation) -> Allocation:
        """Commit an allocation; returns it with a new shared slot numbered."""
        self.index.commit(allocation.whole)
        self.allocated_milli += WHOLE * sum(allocation.whole.values())
        for name, milli in allocation.cpu.items():
            self.free_cpu[name] -= milli
            assert self.free_cpu[name] >= 0, f"CPU over-committed on {name}"
        for name, mib in allocation.memory.items():
            self.free_memory[name] -= mib
            assert self.free_memory[name] >= 0, f"memory over-committed on {name}"
        shared = allocation.shared
        if shared is not None:
            if shared.slot is None:
                self.index.commit({shared.node: 1})
                self._next_slot += 1
                shared = SharedSlot(shared.node, self._next_slot, shared.milli)
                self.slots[shared.node][shared.slot] = WHOLE
                allocation = Allocation(allocation.whole, shared, allocation.cpu,
                                        allocation.memory)
            self.slots[shared.node][shared.slot] -= shared.milli
            assert self.slots[shared.node][shared.slot] >= 0, f"GPU over-shared on {shared.node}"
            self.allocated_milli += shared.milli
        self.touch(allocation)
        return allocation

    def give_back(self, allocation: Allocation) -> None:
        self.index.release(allocation.whole)
        self.allocated_milli -= WHOLE * sum(allocation.whole.values())
        for name, milli in allocation.cpu.items():
            self.free_cpu[name] += milli
        for name, mib in allocation.memory.items():
            self.free_memory[name] += mib
        shared = allocation.shared
        if shared is not None:
            assert shared.slot is not None
            slots = self.slots[shared.node]
            slots[shared.slot] += shared.milli
            self.allocated_milli -= shared.milli
            if slots[shared.slot] == WHOLE:  # the last share left: a whole GPU again
                del slots[shared.slot]
                self.index.release({shared.node: 1})
        self.touch(allocation)

    def touch(self, allocation: Allocation) -> None:
        self.version += 1
        self._changed({*allocation.whole, *allocation.cpu, *allocation.memory,
                       *([allocation.shared.node] if allocation.shared else [])})

    def _changed(self, names: Iterable[str]) -> None:
        for name in names:
            self.node_version[name] += 1
            self.dirty.add(name)

    # --- measures --------------------------------------------------------------------

    def fragmentation(self) -> float:
        """Share of the free GPU capacity that is not on wholly free nodes (0 when none free).

        A wholly free node can take any job up to its size; free GPUs on partly used nodes
        can take only smaller jobs, or force a larger one across nodes."""
        free_milli = 0
        on_free_nodes = 0
        for name, node in self.nodes.items():
            whole = self.index.free_gpus(name)
            shares = sum(self.slots[name].values())
            free_milli += WHOLE * whole + shares
            if whole == node.gpus and node.gpus and not self.slots[name]:
                on_free_nodes += WHOLE * whole
        return 1 - on_free_nodes / free_milli if free_milli else 0.0


def engine_node(node: ClusterNode) -> Node:
    return Node(name=node.name, labels={"spine": node.spine, "leaf": node.leaf},
                free_gpus=node.gpus, gpu_model=node.gpu_model, total_gpus=node.gpus)


def fits_empty_cluster(cluster: Cluster, job: Job) -> bool:
    """Could the job run at all, on the cluster with nothing else on it?"""
    usable = 0
    for node in cluster.nodes:
        if job.gpus and job.gpu_models is not None and node.gpu_model not in job.gpu_models:
            continue
        if not job.gpus or job.is_shared:
            if (node.cpu_milli >= job.cpu_milli and node.memory_mib >= job.memory_mib
                    and (node.gpus or not job.gpus)):
                return True
            continue
        gpus = node.gpus
        if job.cpu_milli:
            gpus = min(gpus, node.cpu_milli * job.gpus // job.cpu_milli)
        if job.memory_mib:
            gpus = min(gpus, node.memory_mib * job.gpus // job.memory_mib)
        usable += gpus
    return bool(job.gpus) and not job.is_shared and usable >= job.gpus

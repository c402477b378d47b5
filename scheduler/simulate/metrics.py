"""Measures of a finished simulation, each small enough to check by hand."""

from __future__ import annotations

from collections.abc import Sequence

from fabric.core.locality import LEVEL_RANK
from scheduler.simulate.cluster import Cluster
from scheduler.simulate.workload import Job


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spanned_level(cluster: Cluster, nodes: Sequence[str]) -> str:
    """The lowest level with one domain holding all of `nodes`."""
    snapshot = cluster.snapshot
    if len(set(nodes)) == 1:
        return "node"
    for level in ("leaf", "spine"):
        if len({snapshot.domain_of(name, level) for name in nodes}) == 1:
            return level
    return "fabric"


def leaves_spanned(cluster: Cluster, nodes: Sequence[str]) -> int:
    return len({cluster.snapshot.domain_of(name, "leaf") for name in nodes})


def fewest_leaves(cluster: Cluster, job: Job) -> int:
    """The fewest leaves of the empty cluster whose GPUs of the job's models hold it."""
    per_leaf: dict[str, int] = {}
    for node in cluster.nodes:
        if job.gpu_models is None or node.gpu_model in job.gpu_models:
            per_leaf[node.leaf] = per_leaf.get(node.leaf, 0) + node.gpus
    held = count = 0
    for gpus in sorted(per_leaf.values(), reverse=True):
        if held >= job.gpus:
            break
        held += gpus
        count += 1
    return count


class SmallestDomain:
    """The lowest level at which one domain of the empty cluster has enough GPUs of the
    job's models: the best any placement could do (memoised per GPU count and models)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._known: dict[tuple, str] = {}

    def level(self, job: Job) -> str:
        key = (job.gpus, job.gpu_models)
        if key not in self._known:
            self._known[key] = self._level(job)
        return self._known[key]

    def _level(self, job: Job) -> str:
        per = {"node": {}, "leaf": {}, "spine": {}}
        for node in self.cluster.nodes:
            if job.gpu_models is not None and node.gpu_model not in job.gpu_models:
                continue
            for level, domain in (("node", node.name), ("leaf", node.leaf),
                                  ("spine", node.spine)):
                per[level][domain] = per[level].get(domain, 0) + node.gpus
        for level in ("node", "leaf", "spine"):
            if max(per[level].values(), default=0) >= job.gpus:
                return level
        return "fabric"


def locality(cluster: Cluster, placed: Sequence[tuple[Job, Sequence[str]]]) -> dict:
    """`minimal_domain_share`: of the jobs with two or more whole GPUs, the share placed inside
    a domain of the smallest level that could have held them on the empty cluster.
    `mean_leaves_multi_node`: leaves spanned, on average, by the jobs placed on several nodes;
    `mean_excess_leaves_multi_node`: how many more than the fewest the empty cluster allows."""
    smallest = SmallestDomain(cluster)
    multi_gpu = minimal = 0
    leaves: list[int] = []
    excess: list[int] = []
    fewest: dict[tuple, int] = {}
    for job, nodes in placed:
        if job.gpus < 2 or job.is_shared:
            continue
        multi_gpu += 1
        used = spanned_level(cluster, nodes)
        if LEVEL_RANK[used] <= LEVEL_RANK[smallest.level(job)]:
            minimal += 1
        if len(set(nodes)) > 1:
            leaves.append(leaves_spanned(cluster, nodes))
            key = (job.gpus, job.gpu_models)
            if key not in fewest:
                fewest[key] = fewest_leaves(cluster, job)
            excess.append(leaves[-1] - fewest[key])
    return {
        "minimal_domain_share": minimal / multi_gpu if multi_gpu else None,
        "mean_leaves_multi_node": mean(leaves),
        "mean_excess_leaves_multi_node": mean(excess),
        "multi_gpu_jobs": multi_gpu,
        "multi_node_jobs": len(leaves),
    }

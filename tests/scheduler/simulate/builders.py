"""Small clusters and jobs written out by hand for the simulator's tests."""

from __future__ import annotations

from scheduler.simulate.cluster import Cluster, ClusterNode, label_nodes, snapshot_of
from scheduler.simulate.workload import Job

BIG = 1_000_000  # CPU milli and memory MiB that never run out


def node(name: str, gpus: int = 4, leaf: str = "", spine: str = "", model: str = "A100",
         cpu: int = BIG, memory: int = BIG) -> ClusterNode:
    return ClusterNode(name, model, gpus, 40_960, cpu, memory, leaf, spine)


def cluster(*nodes: ClusterNode) -> Cluster:
    labelled = label_nodes(list(nodes), None)
    return Cluster(tuple(labelled), snapshot_of(labelled))


def flat(count: int, gpus: int = 4) -> Cluster:
    """`count` nodes of `gpus` GPUs in one flat domain."""
    return cluster(*(node(f"n{i}", gpus) for i in range(1, count + 1)))


def two_leaves() -> Cluster:
    """n1, n2 under leaf l1 and n3, n4 under leaf l2, one spine; 4 GPUs each."""
    return cluster(node("n1", leaf="l1", spine="s"), node("n2", leaf="l1", spine="s"),
                   node("n3", leaf="l2", spine="s"), node("n4", leaf="l2", spine="s"))


def job(name: str, submit: float = 0, duration: float = 10, gpus: int = 1, milli: int = 1000,
        models: str = "", cpu: int = 0, memory: int = 0) -> Job:
    global _position
    _position += 1
    return Job(name, submit, duration, gpus, milli if gpus else 0,
               frozenset(models.split("|")) if models else None, cpu, memory, "", _position)


_position = 0

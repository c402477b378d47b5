"""Alibaba's openb trace (clusterdata, cluster-trace-gpu-v2023) and the FGD paper's arrivals.

The trace is not in the repository; `bench/openb_bench.py --trace DIR` reads it from where the
user keeps it. Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods: `name,cpu_milli,memory_mib,
num_gpu,gpu_milli,gpu_spec,...` (`gpu_milli` per GPU; `gpu_spec` GPU models joined by `|`).

The experiment of "Beware of Fragmentation" (USENIX ATC '23, Fig. 7 and 9): the trace's pods in
a seeded random order, followed by pods drawn at random from the trace, arrive one by one;
each is placed at once or fails, nothing leaves, and the allocation ratio (milli-GPUs
allocated over the cluster's) is read when the GPUs asked for reach a fraction of capacity.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from scheduler.simulate.cluster import Cluster, ClusterNode, label_nodes, snapshot_of
from scheduler.simulate.policies import Policy
from scheduler.simulate.state import ClusterState
from scheduler.simulate.workload import WHOLE, Job, parse_models

NODE_FILE = "openb_node_list_all_node.csv"


def pod_file(workload: str) -> str:
    return f"openb_pod_list_{workload}.csv"


def load_openb_cluster(path: Path) -> Cluster:
    """The nodes of openb (GPU and CPU-only ones), one flat domain (the trace records no
    fabric)."""
    with open(path, newline="") as handle:
        nodes = [
            ClusterNode(name=row["sn"], gpu_model=row["model"] if int(row["gpu"]) else "",
                        gpus=int(row["gpu"]), gpu_memory_mib=0,
                        cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]))
            for row in csv.DictReader(handle)
        ]
    labelled = label_nodes(nodes, None)
    return Cluster(tuple(labelled), snapshot_of(labelled))


def load_openb_pods(path: Path) -> list[Job]:
    """Pods in name order; a share is `num_gpu` 1 with `gpu_milli` below 1000."""
    with open(path, newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda row: row["name"])
    jobs = []
    for position, row in enumerate(rows):
        gpus = int(row["num_gpu"])
        milli = int(row["gpu_milli"]) if gpus else 0
        jobs.append(Job(row["name"], 0.0, 0.0, gpus=gpus,
                        gpu_milli=milli if gpus == 1 else (WHOLE if gpus else 0),
                        gpu_models=parse_models(row.get("gpu_spec") or ""),
                        cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]),
                        position=position))
    return jobs


def arrivals(jobs: Sequence[Job], seed: int) -> Iterator[Job]:
    """The trace's pods shuffled by `seed`, then pods drawn from it with replacement."""
    rng = random.Random(seed)
    order = list(jobs)
    rng.shuffle(order)
    yield from order
    while True:
        yield rng.choice(jobs)


def allocation_at(cluster: Cluster, jobs: Sequence[Job], policy: Policy, seed: int,
                  fraction: float = 1.0) -> dict:
    """Place arrivals until the next one would take the GPUs asked for past `fraction` of
    the cluster's; the allocation ratio then, with the counts behind it."""
    state = ClusterState(cluster, "pod")
    limit = fraction * cluster.total_gpus * WHOLE
    asked = placed = failed = 0
    for job in arrivals(jobs, seed):
        demand = job.gpus * job.gpu_milli
        if asked + demand > limit:
            break
        asked += demand
        allocation = (policy.place(state, job)
                      if job.whole_gpus <= state.free_whole(job.gpu_models) else None)
        if allocation is None:
            failed += 1
        else:
            state.take(allocation)
            placed += 1
    return {"allocation_ratio": state.allocated_milli / WHOLE / cluster.total_gpus,
            "asked_gpus": asked / WHOLE, "placed": placed, "failed": failed}

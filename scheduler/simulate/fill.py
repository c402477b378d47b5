"""The fill experiment of the fragmentation literature (FGD, USENIX ATC '23): no departures."""

from __future__ import annotations

import random
from collections.abc import Sequence

from scheduler.simulate.cluster import Cluster
from scheduler.simulate.metrics import locality as locality_of
from scheduler.simulate.policies import Policy
from scheduler.simulate.state import ClusterState
from scheduler.simulate.workload import WHOLE, Job


def fill(cluster: Cluster, jobs: Sequence[Job], policy: Policy, fractions: Sequence[float],
         seed: int, locality: str = "pod") -> dict[float, dict]:
    """Draw jobs at random with replacement and place each at once or refuse it, until the
    GPUs asked for reach each fraction of the cluster's GPUs; nothing ever leaves."""
    asking = [job for job in jobs if job.gpus]
    if not asking:
        raise ValueError("the workload asks for no GPUs")
    rng = random.Random(seed)
    state = ClusterState(cluster, locality)
    placed: list[tuple[Job, list[str]]] = []
    total = cluster.total_gpus
    asked = 0.0
    drawn = refused = 0
    out: dict[float, dict] = {}
    for fraction in sorted(set(fractions)):
        while asked < fraction * total:
            job = rng.choice(jobs)
            drawn += 1
            asked += job.gpu_demand
            allocation = (policy.place(state, job)
                          if job.whole_gpus <= state.free_whole(job.gpu_models) else None)
            if allocation is None:
                refused += 1
            else:
                placed.append((job, state.take(allocation).nodes))
        out[fraction] = {
            "allocation_ratio": state.allocated_milli / WHOLE / total,
            "asked_gpus": asked,
            "allocated_gpus": state.allocated_milli / WHOLE,
            "jobs_drawn": drawn,
            "jobs_refused": refused,
            "locality": locality_of(cluster, placed),
        }
    return out

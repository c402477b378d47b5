"""Side by side with Slurm: one stream of jobs placed by Slurm and by IBEX's placement engine.

    sudo .venv/bin/python bench/slurm_peer.py [--nodes 256] [--leaf 16] [--jobs N] [--seed 1]
        [--trace ../shared/data/traces/philly.csv] [--min-gpus 1] [--load RHO] [--small]
        [--detail]

The cluster: `--nodes` nodes of 8 GPUs in leaves of `--leaf` nodes (topology/tree), every leaf
under one spine; `--small` is 32 nodes in leaves of 8, for a quick check. The stream: `--jobs`
jobs (default: as many as the cluster has GPUs; Philly's jobs average 1.3 GPUs, so the stream
asks for about 1.3 times the cluster) whose sizes are drawn with `--seed` from the trace's
`num_gpus` (`--min-gpus` leaves out smaller jobs) and mapped to the shapes both sides can run:
up to 8 GPUs round up to 1, 2, 4 or 8 GPUs on one node; more round up to a multiple of 8, on
whole nodes. By default no job ends, so the stream fills the cluster; every job is started at
once or refused, never queued.

`--load RHO` lets jobs end, the same way on both sides: each job keeps its trace duration, the
jobs arrive one per step with steps of equal length, chosen so that, were nothing refused, the
jobs would hold RHO times the cluster's GPUs on average over the second half of the stream,
and a job that started ends just before the first arrival at or after its end (Slurm:
`scancel`, waited for until the job no longer runs; IBEX: `release`). Ends free GPUs and nodes
in the middle of leaves, which is where the two placers part.

Slurm: a real slurmctld, `select/cons_tres` with `topology/tree`, and one slurmd per node,
started in a temporary directory by `tests/agent/slurm/cluster.py` (needs root, slurm-wlm and
munge). Each job is one `salloc --immediate --no-shell`: salloc asks for an allocation
(`job_allocate` with allocate set, so slurmctld selects nodes inside the request itself, not on
a later scheduler pass), and with `--immediate` a job that cannot start now is refused rather
than queued; `--no-shell` returns as soon as the allocation is granted and the job then holds
it, with no time limit and no process behind it. `sbatch --immediate` would not do: for a batch
job slurmctld only tests that the job could run and leaves the start to its next scheduling
pass. Single-node jobs ask `-N 1 --gres=gpu:G`, multi-node jobs `-N M --gres=gpu:8`, with
`--mem=1` (memory is a consumable resource here) and 16 cores per node, so neither memory nor
cores ever refuse a job. Where each job went is read from `scontrol show job` once the stream
is placed (ended jobs keep their NodeList there; MinJobAge is an hour), and the GPUs still in
use are checked against `scontrol show nodes -d`.

IBEX: the pure placement engine (`scheduler.core.placement`, no Django) over the same nodes
and leaves, best fit: a single-node job is `Request(G, required="node")`, a multi-node job
`Request(8M, preferred="leaf", slice=Slice(8, "node"))`, the way the exchange places a
whole-node lease that prefers one leaf; each placement is committed before the next job.

Printed for each: jobs started, GPUs allocated, multi-node jobs started, their mean leaves, the
share of them on the fewest leaves possible (ceil(nodes / leaf size)), and the wall time of the
stream (Slurm's includes one salloc process per job, and the scancels; slurmctld's own time
for the granted allocations, from its log, is printed beside it); then the ratios ours / Slurm.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout this script sits in, not an installed copy

from agent.slurm.scontrol import parse_nodes_text  # noqa: E402
from fabric.core.hostlist import expand_hostlist  # noqa: E402
from fabric.core.locality import ONE_FABRIC_WIDEST_FIRST  # noqa: E402
from scheduler.core.placement import Node, PlacementIndex, Request, Slice  # noqa: E402
from tests.agent.slurm.cluster import (  # noqa: E402
    GPUS_PER_NODE,
    leaves_of,
    missing_programs,
    node_names,
    start_cluster,
)

DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly.csv"
SMALL_NODES, SMALL_LEAF = 32, 8
# One core per job per node at the least; twice the GPUs, so cores never refuse a job.
CPUS_PER_NODE = 2 * GPUS_PER_NODE
SINGLE_NODE_SHAPES = (1, 2, 4, 8)
# Ended jobs stay in `scontrol show job`, with their nodes, for this long after they end.
MIN_JOB_AGE_S = 3600
SALLOC = shutil.which("salloc") or "salloc"
GRANTED = re.compile(r"Granted job allocation (\d+)")
CONTROLLER_USEC = re.compile(r"_slurm_rpc_allocate_resources JobId=\d+ NodeList=\S+ usec=(\d+)")


# --- the stream -----------------------------------------------------------------------------


def job_shape(num_gpus: int) -> int:
    """The GPUs a job of the trace asks for, as a shape both sides run: 1, 2, 4 or 8 on one
    node, otherwise whole nodes (a multiple of 8)."""
    if num_gpus < 1:
        raise ValueError(f"a job needs at least one GPU, not {num_gpus}")
    if num_gpus <= GPUS_PER_NODE:
        return next(shape for shape in SINGLE_NODE_SHAPES if shape >= num_gpus)
    return GPUS_PER_NODE * math.ceil(num_gpus / GPUS_PER_NODE)


def nodes_of(shape: int) -> int:
    """Nodes a job of `shape` GPUs takes: one, or whole nodes."""
    return max(1, shape // GPUS_PER_NODE)


@dataclass(frozen=True)
class Job:
    """One job of the stream: its GPUs (a shape), and the position in the stream just before
    which it ends, or None when it never does."""

    shape: int
    end: int | None = None

    @property
    def nodes(self) -> int:
        return nodes_of(self.shape)


def trace_jobs(path: Path, min_gpus: int = 1) -> list[tuple[int, float]]:
    """(num_gpus, duration in seconds) of every job in the trace
    (timestamp,duration,num_gpus,gpu_time,cluster) that asks for at least `min_gpus`."""
    with open(path, newline="") as handle:
        rows = [(int(float(row["num_gpus"])), float(row["duration"] or 0))
                for row in csv.DictReader(handle) if row["num_gpus"]]
    return [(gpus, duration) for gpus, duration in rows if gpus >= max(1, min_gpus)]


def draw_stream(rows: Sequence[tuple[int, float]], jobs: int, seed: int,
                load: float | None = None, gpus: int = 0) -> list[Job]:
    """`jobs` jobs drawn with replacement from the trace's (num_gpus, duration) rows.

    Without `load` no job ends. With it, the jobs arrive one per step and each ends at the
    first arrival at or after its end (one step after its own arrival at the soonest); the
    length of a step is chosen so that, were nothing refused, the jobs would hold `load` x
    `gpus` GPUs on average over the second half of the stream."""
    rng = random.Random(seed)
    drawn = rng.choices(rows, k=jobs)
    shapes = [job_shape(num_gpus) for num_gpus, _ in drawn]
    if load is None:
        return [Job(shape) for shape in shapes]
    durations = [duration for _, duration in drawn]

    def stream_for(step_s: float) -> list[Job]:
        return [Job(shape, position + max(1, math.ceil(duration / step_s)))
                for position, (shape, duration) in enumerate(zip(shapes, durations, strict=True))]

    target = load * gpus
    low, high = 1e-3, max(durations + [1.0])  # held GPUs fall as steps grow longer
    for _ in range(60):
        middle = math.sqrt(low * high)
        if offered_gpus(stream_for(middle)) > target:
            low = middle
        else:
            high = middle
    return stream_for(high)


def offered_gpus(stream: Sequence[Job]) -> float:
    """The GPUs the stream's jobs would hold, nothing refused, averaged over its second half."""
    change = [0] * (len(stream) + 1)
    for position, job in enumerate(stream):
        change[position] += job.shape
        end = len(stream) if job.end is None else min(job.end, len(stream))
        change[end] -= job.shape
    held, total, half = 0, 0, len(stream) // 2
    for position in range(len(stream)):
        held += change[position]
        if position >= half:
            total += held
    return total / max(1, len(stream) - half)


def ends_by_position(stream: Sequence[Job]) -> dict[int, list[int]]:
    """Stream position -> the positions of the jobs that end just before it, in order."""
    ending: dict[int, list[int]] = {}
    for position, job in enumerate(stream):
        if job.end is not None and job.end < len(stream):
            ending.setdefault(job.end, []).append(position)
    return ending


# --- what both sides are measured by --------------------------------------------------------


def fewest_leaves(nodes: int, leaf_size: int) -> int:
    """The fewest leaves `nodes` whole nodes can span."""
    return math.ceil(nodes / leaf_size)


def leaf_metrics(
    placements: Iterable[Sequence[str]], leaf_of: Mapping[str, str], leaf_size: int
) -> tuple[float | None, float | None]:
    """For multi-node jobs given by their nodes: the mean leaves spanned, and the share on the
    fewest leaves possible. (None, None) when there are none."""
    spans = [(len({leaf_of[node] for node in nodes}), fewest_leaves(len(nodes), leaf_size))
             for nodes in placements]
    if not spans:
        return None, None
    return (statistics.mean(used for used, _ in spans),
            sum(used == fewest for used, fewest in spans) / len(spans))


@dataclass
class Outcome:
    """One side's result: for each job of the stream, its nodes, or None when refused."""

    name: str
    placed: list[list[str] | None]
    wall_s: float
    note: str = ""

    def started(self, stream: Sequence[Job]) -> list[tuple[Job, list[str]]]:
        return [(job, nodes) for job, nodes in zip(stream, self.placed, strict=True)
                if nodes is not None]

    def figures(self, stream: Sequence[Job], leaf_of: Mapping[str, str],
                leaf_size: int) -> dict[str, float | None]:
        started = self.started(stream)
        multi = [nodes for job, nodes in started if job.nodes > 1]
        mean_leaves, fewest_share = leaf_metrics(multi, leaf_of, leaf_size)
        return {"jobs started": len(started),
                "GPUs allocated": sum(job.shape for job, _ in started),
                "multi-node jobs started": len(multi), "mean leaves per multi-node job":
                mean_leaves, "multi-node jobs on fewest leaves": fewest_share,
                "wall time (s)": self.wall_s}


# --- IBEX -----------------------------------------------------------------------------------


def engine_request(shape: int) -> Request:
    """A single-node job on one node; a multi-node job on whole nodes, one leaf preferred."""
    if nodes_of(shape) == 1:
        return Request(shape, required="node")
    return Request(shape, preferred="leaf", slice=Slice(GPUS_PER_NODE, "node"))


def run_engine(stream: Sequence[Job], leaves: Mapping[str, list[str]]) -> Outcome:
    nodes = [Node(name=name, labels={"spine": "spine", "leaf": leaf}, free_gpus=GPUS_PER_NODE,
                  gpu_model="H100-80GB", total_gpus=GPUS_PER_NODE)
             for leaf, members in leaves.items() for name in members]
    ending = ends_by_position(stream)
    start = time.perf_counter()
    index = PlacementIndex(ONE_FABRIC_WIDEST_FIRST, nodes)
    held: list[Mapping[str, int] | None] = []
    for position, job in enumerate(stream):
        for ended in ending.get(position, ()):
            if held[ended] is not None:
                index.release(held[ended])
        placement = index.place(engine_request(job.shape))
        held.append(placement.assignment if placement.placed else None)
        if placement.placed:
            index.commit(placement.assignment)
    wall_s = time.perf_counter() - start
    return Outcome("IBEX engine (best_fit)",
                   [None if assignment is None else list(assignment) for assignment in held],
                   wall_s)


# --- Slurm ----------------------------------------------------------------------------------


def salloc_args(shape: int) -> list[str]:
    nodes = nodes_of(shape)
    per_node = shape if nodes == 1 else GPUS_PER_NODE
    return ["--immediate", "--no-shell", "--mem=1", f"--nodes={nodes}", f"--gres=gpu:{per_node}"]


def run_slurm(stream: Sequence[Job], node_count: int, leaf_size: int, base: Path) -> Outcome:
    started = time.perf_counter()
    cluster = start_cluster(base, nodes=node_count, leaf_size=leaf_size,
                            cpus_per_node=CPUS_PER_NODE,
                            extra_config=f"MinJobAge={MIN_JOB_AGE_S}")
    print(f"slurm: {node_count} slurmd, slurmctld and munged up in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    ending = ends_by_position(stream)
    try:
        job_ids: list[str | None] = []
        start = time.perf_counter()
        for position, job in enumerate(stream):
            ended = [job_ids[e] for e in ending.get(position, ()) if job_ids[e] is not None]
            if ended:
                _end_jobs(cluster, ended)
            job_ids.append(_salloc(cluster, position, job))
        wall_s = time.perf_counter() - start
        nodes_by_job = _nodes_by_job(cluster)
        placed = [None if job_id is None else nodes_by_job[job_id] for job_id in job_ids]
        _check_gpus_in_use(cluster, stream, placed)
        controller_s = sum(int(usec) for usec in CONTROLLER_USEC.findall(
            (cluster.root / "log" / "slurmctld.log").read_text())) / 1e6
    finally:
        cluster.stop()
    return Outcome("Slurm 22.05 (cons_tres + topology/tree)", placed, wall_s,
                   note=f"slurmctld's own time in the granted allocations: {controller_s:.2f} s")


def _salloc(cluster, position: int, job: Job) -> str | None:
    """The job id when Slurm started the job now, None when it refused it."""
    result = subprocess.run(
        [SALLOC, f"--job-name=peer-{position}", *salloc_args(job.shape)],
        env=cluster.env, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        return None
    granted = GRANTED.search(result.stderr)
    if granted is None:
        raise RuntimeError(f"salloc said neither yes nor no: {result.stderr.strip()}")
    return granted.group(1)


def _end_jobs(cluster, job_ids: list[str]) -> None:
    """Cancel the jobs and wait until none of them runs, so their GPUs are free again."""
    subprocess.run(["scancel", *job_ids], env=cluster.env, check=True, timeout=30)
    deadline = time.monotonic() + 30
    while subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i", "-j", ",".join(job_ids)],
                         env=cluster.env, capture_output=True, text=True, timeout=30,
                         check=True).stdout.strip():
        if time.monotonic() > deadline:
            raise RuntimeError(f"jobs {job_ids} still run 30 s after scancel")
        time.sleep(0.01)


def _nodes_by_job(cluster) -> dict[str, list[str]]:
    """Job id -> the nodes it was given, for every job Slurm still knows (ended ones too)."""
    nodes_by_job = {}
    for line in cluster.scontrol("show", "job", "-o", timeout=120).splitlines():
        fields = dict(word.split("=", 1) for word in line.split()
                      if word.startswith(("JobId=", "NodeList=")))
        if "JobId" in fields and fields.get("NodeList", "(null)") != "(null)":
            nodes_by_job[fields["JobId"]] = expand_hostlist(fields["NodeList"])
    return nodes_by_job


def _check_gpus_in_use(cluster, stream: Sequence[Job], placed: Sequence[list[str] | None]) -> None:
    """What the granted jobs that have not ended asked for must be what the nodes say is in use."""
    asked = sum(job.shape for job, nodes in zip(stream, placed, strict=True)
                if nodes is not None and (job.end is None or job.end >= len(stream)))
    in_use = sum(sum((node.gpus_used or {}).values())
                 for node in parse_nodes_text(cluster.scontrol("show", "nodes", "-d")))
    if asked != in_use:
        raise RuntimeError(f"granted jobs asked for {asked} GPUs but Slurm's nodes have "
                           f"{in_use} in use")


# --- report ---------------------------------------------------------------------------------


def _cell(value: float | None, name: str) -> str:
    if value is None:
        return "–"
    if name == "multi-node jobs on fewest leaves":
        return f"{100 * value:.0f} %"
    if name == "mean leaves per multi-node job":
        return f"{value:.2f}"
    if name == "wall time (s)":
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if ours is None or theirs is None or theirs == 0:
        return "–"
    return f"{ours / theirs:.3f}"


def report(stream: Sequence[Job], slurm: Outcome, ours: Outcome, leaf_of: Mapping[str, str],
           leaf_size: int, detail: bool) -> None:
    theirs_f = slurm.figures(stream, leaf_of, leaf_size)
    ours_f = ours.figures(stream, leaf_of, leaf_size)
    names = list(theirs_f)
    print("| placer | " + " | ".join(names) + " |")
    print("| --- |" + " ---: |" * len(names))
    for outcome, figures in ((slurm, theirs_f), (ours, ours_f)):
        print(f"| {outcome.name} | " + " | ".join(_cell(figures[n], n) for n in names) + " |")
    print("| ours / Slurm | " + " | ".join(_ratio(ours_f[n], theirs_f[n]) for n in names) + " |")
    if slurm.note:
        print(slurm.note)
    if detail:
        print("multi-node jobs (position: nodes -> leaves used by Slurm / IBEX, '-' refused):")
        for position, job in enumerate(stream):
            if job.nodes > 1:
                spans = ["-" if side.placed[position] is None
                         else str(len({leaf_of[n] for n in side.placed[position]}))
                         for side in (slurm, ours)]
                print(f"  {position}: {job.nodes} nodes -> {spans[0]} / {spans[1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=None, help="nodes of 8 GPUs (default 256)")
    parser.add_argument("--leaf", type=int, default=None, help="nodes per leaf (default 16)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="jobs in the stream (default: one per GPU of the cluster)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--min-gpus", type=int, default=1,
                        help="draw only from the trace's jobs of at least this many GPUs "
                             "(2: no single-GPU jobs; 9: multi-node jobs only)")
    parser.add_argument("--load", type=float, default=None, metavar="RHO",
                        help="let jobs end, with the trace's durations, at an offered load of "
                             "RHO times the cluster's GPUs (default: no job ends)")
    parser.add_argument("--small", action="store_true",
                        help=f"a quick check: {SMALL_NODES} nodes in leaves of {SMALL_LEAF}")
    parser.add_argument("--detail", action="store_true",
                        help="list every multi-node job and the leaves each side gave it")
    args = parser.parse_args()
    node_count = args.nodes or (SMALL_NODES if args.small else 256)
    leaf_size = args.leaf or (SMALL_LEAF if args.small else 16)
    jobs = args.jobs or node_count * GPUS_PER_NODE

    missing = missing_programs() + ([] if shutil.which("salloc") else ["salloc"])
    if missing:
        sys.exit(f"bench/slurm_peer.py: Slurm is not installed here (no {', '.join(missing)}); "
                 f"apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        sys.exit("bench/slurm_peer.py: the local Slurm cluster needs root (mknod for the GPU "
                 "device files, SlurmUser=root)")

    rows = trace_jobs(Path(args.trace), args.min_gpus)
    if not rows:
        sys.exit(f"bench/slurm_peer.py: no job in {args.trace} asks for {args.min_gpus} GPUs")
    stream = draw_stream(rows, jobs, args.seed, args.load, node_count * GPUS_PER_NODE)
    leaves = leaves_of(node_names(node_count), leaf_size)
    leaf_of = {node: leaf for leaf, members in leaves.items() for node in members}
    multi = Counter(job.nodes for job in stream if job.nodes > 1)
    print(f"# {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"cluster: {node_count} nodes x {GPUS_PER_NODE} GPUs = "
          f"{node_count * GPUS_PER_NODE:,} GPUs, {len(leaves)} leaves of {leaf_size} under one "
          f"spine")
    drawn_from = "" if args.min_gpus <= 1 else f", jobs of {args.min_gpus}+ GPUs"
    ending = sum(job.end is not None and job.end < jobs for job in stream)
    ends = ("no job ends" if args.load is None else
            f"jobs end, offered load {args.load:g} x the GPUs ({ending:,} end in the stream)")
    shapes = ", ".join(f"{count} of {nodes} nodes" for nodes, count in sorted(multi.items()))
    print(f"stream: {jobs:,} jobs from {Path(args.trace).name}{drawn_from} (seed {args.seed}): "
          f"{jobs - multi.total():,} single-node, {multi.total()} multi-node "
          f"({shapes or 'none'}), asking {sum(job.shape for job in stream):,} GPUs; "
          f"{ends}", flush=True)
    ours = run_engine(stream, leaves)
    with tempfile.TemporaryDirectory(prefix="ibex-slurm-peer-") as base:
        slurm = run_slurm(stream, node_count, leaf_size, Path(base))
    report(stream, slurm, ours, leaf_of, leaf_size, args.detail)


if __name__ == "__main__":
    main()

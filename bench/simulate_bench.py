"""Trace simulator benchmark: the whole Philly trace replayed on a 2,048-GPU fat-tree.

    .venv/bin/python bench/simulate_bench.py [--trace ../shared/data/traces/philly.csv]
        [--policies best_fit,first_fit,random] [--nodes 256] [--radix 32]

Converts the trace and writes the cluster CSV into a temporary folder (nothing is committed),
then times each replay end to end in-process: loading both CSVs, building the fabric and the
placement index, the event loop and the metrics. The target is under 5 minutes per replay on
a 2-core machine. Prints one row per policy.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout this script sits in, not an installed copy

from scheduler.simulate.cluster import load_cluster, make_nodes, write_cluster  # noqa: E402
from scheduler.simulate.convert import convert_trace  # noqa: E402
from scheduler.simulate.engine import Replay  # noqa: E402
from scheduler.simulate.policies import make_policy  # noqa: E402
from scheduler.simulate.workload import load_workload  # noqa: E402

DEFAULT_TRACE = ROOT.parent / "shared" / "data" / "traces" / "philly.csv"
TARGET_S = 300


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--policies", default="best_fit,first_fit,random")
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--radix", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as folder:
        jobs_csv, cluster_csv = f"{folder}/jobs.csv", f"{folder}/cluster.csv"
        started = time.perf_counter()
        count = convert_trace(args.trace, jobs_csv)
        print(f"convert {count} jobs: {time.perf_counter() - started:.1f} s")
        write_cluster(cluster_csv, make_nodes(args.nodes, 8, "V100-32GB", 32_768, 64_000,
                                              512 * 1024))
        print("| policy | GPUs | jobs | wall time (s) | target |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for policy in args.policies.split(","):
            started = time.perf_counter()
            cluster = load_cluster(cluster_csv, f"fat-tree:radix={args.radix}")
            jobs = load_workload(jobs_csv)
            replay = Replay(cluster, jobs, make_policy(policy, args.seed, jobs)).run()
            replay.results()
            elapsed = time.perf_counter() - started
            print(f"| {policy} | {cluster.total_gpus} | {len(jobs)} | {elapsed:.1f} | "
                  f"< {TARGET_S} |")


if __name__ == "__main__":
    main()

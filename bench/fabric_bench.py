"""Benchmarks for the pure fabric core (no Django, no database).

Run from the repository root:  python bench/fabric_bench.py
"""

from __future__ import annotations

import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from fabric.core.generators import fat_tree, torus  # noqa: E402
from fabric.core.hostlist import expand_hostlist  # noqa: E402
from fabric.core.ibnetdiscover import parse_ibnetdiscover  # noqa: E402
from fabric.core.levels import compute_domains, summarise  # noqa: E402
from fabric.core.slurm import export_slurm_tree, parse_slurm_topology  # noqa: E402
from fabric.core.topology import TopologySnapshot  # noqa: E402
from tests.fabric.ibnetdiscover_text import render_ibnetdiscover  # noqa: E402

QUERIES = 1_000_000


def timed(label: str, action):
    start = time.perf_counter()
    result = action()
    print(f"{label:<58} {time.perf_counter() - start:8.3f} s")
    return result


def rate(label: str, count: int, action) -> None:
    start = time.perf_counter()
    action()
    elapsed = time.perf_counter() - start
    print(f"{label:<58} {count / elapsed / 1e6:8.2f} M/s")


def bench_generation():
    print("-- 3-tier fat-tree, 12,500 nodes x 8 GPUs (100,000 GPUs), radix 64")
    spec = timed("generate fat_tree(12500, 64, tiers=3)", lambda: fat_tree(12_500, 64, tiers=3))
    domains = timed("compute_domains", lambda: compute_domains(spec))
    summary = timed("summarise", lambda: summarise(spec))
    print(f"   {len(spec.switches)} switches, {len(spec.links)} links, "
          f"domains {summary['domain_counts']}, gpus {summary['gpus']}")
    rows = [(host, d.leaf, d.spine, 8) for host, d in domains.items()]
    snapshot = timed("TopologySnapshot.from_domains (12,500 rows)",
                     lambda: TopologySnapshot.from_domains(rows))
    timed("TopologySnapshot.from_spec (incl. domains, link rates)",
          lambda: TopologySnapshot.from_spec(spec))
    return snapshot


def bench_queries(snapshot: TopologySnapshot, label: str) -> None:
    rng = random.Random(7)
    nodes = snapshot.nodes
    pairs = [(rng.choice(nodes), rng.choice(nodes)) for _ in range(QUERIES)]
    hops, common = snapshot.hops, snapshot.common_rank

    def single_hops():
        for a, b in pairs:
            hops(a, b)

    def single_common():
        for a, b in pairs:
            common(a, b)

    ids_a = np.asarray([snapshot.node_id(a) for a, _ in pairs])
    ids_b = np.asarray([snapshot.node_id(b) for _, b in pairs])
    print(f"-- queries on {label}, {QUERIES:,} random pairs, one core")
    rate("hops(a, b), one call per pair", QUERIES, single_hops)
    rate("common_rank(a, b), one call per pair", QUERIES, single_common)
    rate("hops_many(pairs of names)", QUERIES, lambda: snapshot.hops_many(pairs))
    rate("hops_ids(id arrays), numpy", QUERIES, lambda: snapshot.hops_ids(ids_a, ids_b))
    rate("common_level_ids(id arrays), numpy", QUERIES,
         lambda: snapshot.common_level_ids(ids_a, ids_b))


def bench_slurm_import() -> None:
    print("-- topology.conf with 10,000 nodes")
    text = export_slurm_tree(fat_tree(10_000, 64, tiers=3))
    print(f"   {len(text.splitlines())} lines, {len(text):,} bytes")
    spec = timed("parse_slurm_topology", lambda: parse_slurm_topology(text))
    timed("compute_domains of the parsed file", lambda: compute_domains(spec))
    # The same fabric written without compression: every node and switch named one by one.
    flat = "\n".join(
        line.split("=", 1)[0] + "=" + line.split("=", 1)[1].split(" ", 1)[0] + " "
        + " ".join(
            part.split("=", 1)[0] + "=" + ",".join(expand_hostlist(part.split("=", 1)[1]))
            for part in line.split(" ")[1:]
        )
        for line in text.splitlines()[1:]
    )
    print(f"   uncompressed: {len(flat):,} bytes")
    timed("parse_slurm_topology, uncompressed hostlists", lambda: parse_slurm_topology(flat))


def bench_ibnetdiscover_import() -> None:
    print("-- ibnetdiscover output of a 2-tier fat-tree, 2,048 nodes, radix 128")
    text = render_ibnetdiscover(fat_tree(2_048, 128, tiers=2))
    print(f"   {len(text.splitlines()):,} lines, {len(text):,} bytes")
    spec = timed("parse_ibnetdiscover", lambda: parse_ibnetdiscover(text))
    timed("compute_domains of the parsed output", lambda: compute_domains(spec))


def main() -> None:
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{platform.processor() or platform.platform()}")
    snapshot = bench_generation()
    bench_queries(snapshot, "the 12,500-node fat-tree")
    bench_queries(TopologySnapshot.from_spec(torus(16, 16, 16, hosts_per_router=2)),
                  "a 16x16x16 torus, 8,192 nodes")
    bench_slurm_import()
    bench_ibnetdiscover_import()


if __name__ == "__main__":
    main()

"""Command line: the simulation itself, and the `convert` and `make-cluster` helpers.

    python -m scheduler.simulate --cluster C.csv --workload J.csv --policy best_fit \
        --mode replay|fill [--fill-to 0.9,1.0,1.3] [--seed 42] [--fabric fat-tree:radix=32] \
        --out RESULT.json [--plot RESULT.png] [--backfill-depth 100] [--locality pod|relaxed]
        [--time-scale 40]
    python -m scheduler.simulate convert --trace philly.csv --out jobs.csv
    python -m scheduler.simulate make-cluster --nodes 256 --gpus 8 --gpu-model V100-32GB \
        --out cluster.csv
    python -m scheduler.simulate ... --mode replay --quotas QUOTAS.csv [--no-borrowing]
    python -m scheduler.simulate make-quotas --workload J.csv --gpus 2048 \
        --gpu-model V100-32GB --out QUOTAS.csv   (see scheduler/simulate/quotas.py)

Bad input ends with exit status 2 and one line on stderr naming the file and line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from dataclasses import replace

from scheduler.simulate.cluster import load_cluster, make_nodes, write_cluster
from scheduler.simulate.convert import convert_trace
from scheduler.simulate.engine import DEFAULT_BACKFILL_DEPTH, Replay
from scheduler.simulate.errors import InputError
from scheduler.simulate.fill import fill
from scheduler.simulate.policies import POLICY_NAMES, make_policy
from scheduler.simulate.state import LOCALITY_RULES
from scheduler.simulate.workload import Job, load_workload

BAD_INPUT = 2


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, not usage text and a traceback."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}")


def simulate_parser() -> Parser:
    parser = Parser(prog="python -m scheduler.simulate")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--workload", required=True)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--mode", required=True, choices=("replay", "fill"))
    parser.add_argument("--fill-to", default="0.9,1.0,1.3")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fabric")
    parser.add_argument("--out", required=True)
    parser.add_argument("--plot")
    parser.add_argument("--backfill-depth", type=int, default=DEFAULT_BACKFILL_DEPTH)
    parser.add_argument("--locality", choices=LOCALITY_RULES, default="pod")
    parser.add_argument("--compact-slack", type=int, default=None,
                        help="replay: a job spanning nodes waits for a shape on at most this "
                             "many leaves over its fewest (up to --compact-patience hours)")
    parser.add_argument("--compact-patience", type=float, default=24.0,
                        help="hours a job spanning nodes may be held for a compact shape, "
                             "from when it could first have started spread")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="divide every submit time by this (40: the trace arrives 40 "
                             "times faster, run times unchanged)")
    parser.add_argument("--quotas", help="tenant,gpu_model,nominal,borrowing_limit,"
                                         "lending_limit,priority: replay under quotas")
    parser.add_argument("--no-borrowing", action="store_true",
                        help="with --quotas: every tenant is held to its nominal")
    return parser


def make_quotas_parser() -> Parser:
    parser = Parser(prog="python -m scheduler.simulate make-quotas")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--gpu-model", default="V100-32GB")
    parser.add_argument("--out", required=True)
    return parser


def convert_parser() -> Parser:
    parser = Parser(prog="python -m scheduler.simulate convert")
    parser.add_argument("--trace", required=True, help="timestamp,duration,num_gpus[,cluster]")
    parser.add_argument("--out", required=True)
    return parser


def make_cluster_parser() -> Parser:
    parser = Parser(prog="python -m scheduler.simulate make-cluster")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-model", default="V100-32GB")
    parser.add_argument("--gpu-memory-mib", type=int, default=32_768)
    parser.add_argument("--cpu-milli", type=int, default=64_000)
    parser.add_argument("--memory-mib", type=int, default=512 * 1024)
    parser.add_argument("--out", required=True)
    return parser


def main(argv: Sequence[str]) -> int:
    try:
        if argv and argv[0] == "convert":
            return run_convert(convert_parser().parse_args(argv[1:]))
        if argv and argv[0] == "make-cluster":
            return run_make_cluster(make_cluster_parser().parse_args(argv[1:]))
        if argv and argv[0] == "make-quotas":
            return run_make_quotas(make_quotas_parser().parse_args(argv[1:]))
        return run_simulation(simulate_parser().parse_args(argv))
    except (InputError, UsageError) as error:
        print(error, file=sys.stderr)
        return BAD_INPUT


def run_convert(args: argparse.Namespace) -> int:
    count = convert_trace(args.trace, args.out)
    print(f"{count} jobs written to {args.out}")
    return 0


def run_make_cluster(args: argparse.Namespace) -> int:
    if args.nodes < 1 or args.gpus < 0:
        raise UsageError("make-cluster: --nodes must be at least 1, --gpus not negative")
    nodes = make_nodes(args.nodes, args.gpus, args.gpu_model, args.gpu_memory_mib,
                       args.cpu_milli, args.memory_mib)
    write_cluster(args.out, nodes)
    print(f"{len(nodes)} nodes, {args.nodes * args.gpus} GPUs written to {args.out}")
    return 0


def run_make_quotas(args: argparse.Namespace) -> int:
    from scheduler.simulate.quotas import make_quotas, write_quotas

    if args.gpus < 1:
        raise UsageError("make-quotas: --gpus must be at least 1")
    quotas = make_quotas(load_workload(args.workload), args.gpus, args.gpu_model)
    write_quotas(args.out, quotas)
    print(f"{len(quotas)} tenants, {args.gpus} GPUs of nominal quota written to {args.out}")
    return 0


def parse_fractions(text: str) -> dict[str, float]:
    """Fractions keyed by the text given, so the JSON reads back exactly what was asked."""
    out = {}
    for part in filter(None, (item.strip() for item in text.split(","))):
        try:
            value = float(part)
        except ValueError:
            raise UsageError(f"--fill-to: {part!r} is not a number") from None
        if not 0 < value < 100:
            raise UsageError(f"--fill-to: {part} must be above 0")
        out[part] = value
    if not out:
        raise UsageError("--fill-to: no fractions")
    return out


def run_simulation(args: argparse.Namespace) -> int:
    if args.policy not in POLICY_NAMES:
        raise UsageError(f"--policy: unknown policy {args.policy!r} "
                         f"(choose {', '.join(POLICY_NAMES)})")
    if args.backfill_depth < 0:
        raise UsageError("--backfill-depth must not be negative")
    fractions = parse_fractions(args.fill_to) if args.mode == "fill" else {}
    cluster = load_cluster(args.cluster, args.fabric)
    if not args.time_scale > 0:
        raise UsageError("--time-scale must be above 0")
    jobs = compress(load_workload(args.workload), args.time_scale)
    policy = make_policy(args.policy, args.seed, jobs)
    result: dict = {
        "mode": args.mode,
        "policy": args.policy,
        "seed": args.seed,
        "fabric": args.fabric,
        "locality_rule": args.locality,
        "time_scale": args.time_scale,
        "inputs": {
            "cluster": {"path": args.cluster, "sha256": sha256_of(args.cluster),
                        "nodes": len(cluster.nodes), "gpus": cluster.total_gpus},
            "workload": {"path": args.workload, "sha256": sha256_of(args.workload),
                         "jobs": len(jobs)},
        },
    }
    if args.no_borrowing and not args.quotas:
        raise UsageError("--no-borrowing needs --quotas")
    if args.quotas and args.mode != "replay":
        raise UsageError("--quotas needs --mode replay")
    if args.quotas and args.plot:
        raise UsageError("--plot is not drawn for a replay under --quotas")
    if args.quotas:
        from scheduler.simulate.quotas import QuotaReplay, load_quotas

        rows = load_quotas(args.quotas)
        result["inputs"]["quotas"] = {"path": args.quotas, "sha256": sha256_of(args.quotas),
                                      "tenants": len({q.tenant for q in rows})}
        result.update(QuotaReplay(cluster, jobs, policy, rows, args.quotas,
                                  borrowing=not args.no_borrowing,
                                  locality=args.locality).run().results())
        summary = (f"under quotas ({'with' if not args.no_borrowing else 'no'} borrowing), "
                   f"mean wait {result['wait_s']['mean']:.0f} s")
    elif args.mode == "replay":
        result["backfill_depth"] = args.backfill_depth
        if args.compact_slack is not None:
            if args.compact_slack < 0 or args.compact_patience < 0:
                raise UsageError("--compact-slack and --compact-patience must not be negative")
            result["compact"] = {"slack_leaves": args.compact_slack,
                                 "patience_h": args.compact_patience}
        replay = Replay(cluster, jobs, policy, backfill_depth=args.backfill_depth,
                        locality=args.locality, compact_slack=args.compact_slack,
                        compact_patience_s=args.compact_patience * 3600).run()
        result.update(replay.results())
        summary = (f"utilization {result['utilization']:.4f}, "
                   f"mean wait {result['wait_s']['mean']:.0f} s")
    else:
        try:
            levels = fill(cluster, jobs, policy, list(fractions.values()), args.seed,
                          args.locality)
        except ValueError as error:
            raise InputError(args.workload, None, str(error)) from None
        result["allocation_ratio"] = {
            text: levels[value]["allocation_ratio"] for text, value in fractions.items()
        }
        result["fill"] = {text: levels[value] for text, value in fractions.items()}
        summary = "allocation ratio " + ", ".join(
            f"{text}: {ratio:.4f}" for text, ratio in result["allocation_ratio"].items())
    write_json(args.out, result)
    if args.plot:
        from scheduler.simulate.plot import plot_fill, plot_replay

        (plot_replay if args.mode == "replay" else plot_fill)(result, args.plot)
    print(f"{args.mode} {args.policy}: {summary}; written to {args.out}")
    return 0


def compress(jobs: list[Job], scale: float) -> list[Job]:
    """Submit times divided by `scale`, durations kept: the same jobs, arriving faster."""
    if scale == 1:
        return jobs
    return [replace(job, submit_s=job.submit_s / scale) for job in jobs]


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: str, result: dict) -> None:
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")
    except OSError as error:
        raise InputError(path, None, f"cannot write: {error.strerror}") from None

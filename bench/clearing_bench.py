"""Auction clearing benchmark: 10,000 bids against a 100,000-GPU snapshot.

    python bench/clearing_bench.py [--seed 1] [--bids 10000] [--small 40]

Snapshot: the placement benchmark's fat tree, 12,500 nodes x 8 GPUs, leaves of 16 nodes,
spine groups of 16 leaves, one GPU model; occupancy per node: 8 used with p = 0.55, none with
p = 0.15, otherwise 1-7. Reserve prices: each node's provider asks a base price from $1.50 to
$2.50 in 5-cent steps; a quarter of the nodes price each free GPU at base + 0-30 cents.
Bids: 1, 2, 4 or 8 GPUs (70 %, required `node` for half of those), 16-64 GPUs required
`leaf` (20 %), 128 or 256 GPUs required `spine` in whole-node slices (5 %), 16-128 GPUs
unconstrained (5 %); limits $1.00-$4.00 in cents, 1-48 hours.

The timed parts: `clear_auction` (the greedy, with the engine's placer, the index build
included, the exact solve off), then `clear_welfare` (`market.core.winners`: welfare-maximising
winner determination within its 5 s budget) with its welfare, certified bound and gap, and the
cost of `price_to_win` for every refused bid. Then the welfare gap to the proven optimum
(`solve_exact`) on `--small` random instances (6-30 bids, 8-40 nodes, reserves and topology
drawn as above, sizes divided by 8), for the greedy and for `clear_welfare`, once with the
bids' hours as drawn, once with every bid for one hour, and once more with every reserve at
$1.50 (the same books and seeds as before `clear_welfare` existed).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fabric.core.locality import ONE_FABRIC_WIDEST_FIRST  # noqa: E402
from market.core.clearing import Bid, NodeOffer, Topology, dollars, solve_exact  # noqa: E402
from market.core.winners import clear_welfare  # noqa: E402
from scheduler.core.clearing_placer import clear_auction_on_index  # noqa: E402

MODEL = "H100-80GB"


def build_nodes(rng: random.Random, count: int, leaf_size: int = 16, spine_size: int = 16):
    nodes = []
    for i in range(count):
        leaf = i // leaf_size
        draw = rng.random()
        used = 8 if draw < 0.55 else 0 if draw < 0.70 else rng.randint(1, 7)
        base = 1_500_000 + 50_000 * rng.randint(0, 20)
        if rng.random() < 0.25:
            prices = tuple(base + 10_000 * rng.randint(0, 30) for _ in range(8 - used))
        else:
            prices = (base,) * (8 - used)
        nodes.append(NodeOffer(
            name=f"n{i:05d}",
            labels={"spine": f"s{leaf // spine_size:02d}", "leaf": f"l{leaf:03d}"},
            gpu_model=MODEL, reserve_micros=prices,
        ))
    return nodes


def build_bids(rng: random.Random, count: int, scale: int = 1):
    bids = []
    for i in range(count):
        draw = rng.random()
        if draw < 0.70:
            gpus = rng.choice((1, 2, 4, 8))
            topology = Topology(required="node") if rng.random() < 0.5 else Topology()
        elif draw < 0.90:
            gpus = rng.choice((16, 24, 32, 48, 64)) // scale
            topology = Topology(required="leaf")
        elif draw < 0.95:
            gpus = rng.choice((128, 256)) // scale
            topology = Topology(required="spine", slice_size=8)
        else:
            gpus = rng.choice((16, 32, 64, 128)) // scale
            topology = Topology()
        bids.append(Bid(
            id=f"b{i:05d}", gpus=max(gpus, 1), hours=Decimal(rng.randint(1, 48)),
            limit_micros=10_000 * rng.randint(100, 400), topology=topology,
        ))
    return bids


def big_clearing(seed: int, bid_count: int) -> None:
    rng = random.Random(seed)
    nodes = build_nodes(rng, 12_500)
    bids = build_bids(rng, bid_count)
    free = sum(node.free_gpus for node in nodes)
    asked = sum(bid.gpus for bid in bids)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        clearing = clear_auction_on_index(ONE_FABRIC_WIDEST_FIRST, nodes, bids, exact=False)
        times.append(time.perf_counter() - started)
    market = clearing.market(MODEL)
    print(f"snapshot: {len(nodes):,} nodes, {8 * len(nodes):,} GPUs, {free:,} free; "
          f"{len(bids):,} bids asking {asked:,} GPUs")
    print(f"clear_auction: best {min(times):.2f} s, median {statistics.median(times):.2f} s "
          f"(3 runs, index build included)")
    print(f"accepted {len(market.accepted):,}, refused {len(market.refused):,}, "
          f"GPUs sold {market.gpus_sold:,}, clearing price ${dollars(market.clearing_price_micros)}"
          f", welfare ${market.welfare:,}")
    welfare_clearing(nodes, bids)


def welfare_clearing(nodes, bids) -> None:
    clearing = clear_welfare(ONE_FABRIC_WIDEST_FIRST, nodes, bids)
    market = clearing.market(MODEL)
    refused = market.refused
    priced = sum(loser.price_to_win_micros is not None for loser in refused)
    print(f"clear_welfare ({market.method}): {clearing.seconds:.2f} s (budget 5 s); "
          f"accepted {len(market.accepted):,}, refused {len(refused):,}, GPUs sold "
          f"{market.gpus_sold:,}, clearing price ${dollars(market.clearing_price_micros)}")
    print(f"  welfare ${market.welfare:,}, bound ${market.welfare_bound:,}, certified gap "
          f"{100 * market.gap:.2f} %, optimal {market.optimal}")
    print(f"  price_to_win for {len(refused):,} refused bids: {clearing.price_to_win_seconds:.2f} s "
          f"({1000 * clearing.price_to_win_seconds / max(1, len(refused)):.2f} ms each); "
          f"{priced:,} priced, {len(refused) - priced:,} fit nowhere")


def small_gaps(seed: int, instances: int, one_hour: bool, one_reserve: bool = False) -> None:
    if instances <= 0:  # `--small 0`: the full-scale clearing only
        return
    rng = random.Random(seed + 1000)
    greedy_gaps, gaps, certified, solve_times, clear_times = [], [], [], [], []
    price_times, refused_counts, optimal_count = [], [], 0
    for _ in range(instances):
        node_count = rng.randint(8, 40)
        nodes = build_nodes(rng, node_count, leaf_size=4, spine_size=3)
        if one_reserve:
            nodes = [dataclasses.replace(node, reserve_micros=(1_500_000,) * node.free_gpus)
                     for node in nodes]
        bids = build_bids(rng, rng.randint(6, 30), scale=8)
        if one_hour:
            bids = [dataclasses.replace(bid, hours=Decimal(1)) for bid in bids]
        greedy = clear_auction_on_index(ONE_FABRIC_WIDEST_FIRST, nodes, bids, exact=False)
        greedy_welfare = greedy.market(MODEL).welfare
        started = time.perf_counter()
        exact = solve_exact(ONE_FABRIC_WIDEST_FIRST, nodes, bids)
        solve_times.append(time.perf_counter() - started)
        cleared = clear_welfare(ONE_FABRIC_WIDEST_FIRST, nodes, bids)
        clear_times.append(cleared.seconds)
        price_times.append(cleared.price_to_win_seconds)
        refused_counts.append(sum(len(market.refused) for market in cleared.markets))
        optimal_count += cleared.optimal
        best = max(exact.welfare, cleared.welfare)
        assert cleared.welfare_bound >= exact.welfare, "the bound must hold"
        greedy_gaps.append(float((best - greedy_welfare) / best) if best else 0.0)
        gaps.append(float((best - cleared.welfare) / best) if best else 0.0)
        certified.append(float(cleared.gap))
    hours = ("all 1 h" if one_hour else "1-48 h") + (", every reserve $1.50" if one_reserve else "")
    print(f"{instances} small instances (6-30 bids, 8-40 nodes, {hours}); HiGHS proves the "
          f"optimum in median {1000 * statistics.median(solve_times):.0f} ms, "
          f"max {1000 * max(solve_times):.0f} ms")
    print(f"  greedy: gap to optimum mean {100 * statistics.mean(greedy_gaps):.2f} %, "
          f"max {100 * max(greedy_gaps):.2f} %, zero in {sum(g == 0 for g in greedy_gaps)}")
    print(f"  clear_welfare: gap to optimum mean {100 * statistics.mean(gaps):.2f} %, "
          f"max {100 * max(gaps):.2f} %, zero in {sum(g == 0 for g in gaps)}; certified gap "
          f"max {100 * max(certified):.2f} %; optimal proven in {optimal_count}; time median "
          f"{1000 * statistics.median(clear_times):.0f} ms, max {1000 * max(clear_times):.0f} ms")
    print(f"  price_to_win: {sum(refused_counts)} refused bids, "
          f"{sum(price_times):.2f} s in all ({1000 * sum(price_times) / max(1, sum(refused_counts)):.0f} ms each)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bids", type=int, default=10_000)
    parser.add_argument("--small", type=int, default=40)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"{platform.machine()}, Python {platform.python_version()}, one core")
    big_clearing(args.seed, args.bids)
    small_gaps(args.seed, args.small, one_hour=False)
    small_gaps(args.seed, args.small, one_hour=True)
    small_gaps(args.seed, args.small, one_hour=True, one_reserve=True)


if __name__ == "__main__":
    main()

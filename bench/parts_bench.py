"""The part placer (MIG slices and shares, docs/parts.md) on a large shareable fleet.

    python bench/parts_bench.py [--gpus 8000] [--seed 1] [--requests 200]

A fleet of H100-80GB nodes of 8 GPUs, every GPU shareable. Half the GPUs already hold parts:
a quarter of those MIG slices (random legal placements of 1g-3g), the rest shares (random
widths of 100-500, packed from 0). Prints the time per request for one share, three shares on
one node, one 1g slice and two 3g slices (the median and the 95th percentile of `--requests`
requests, each on the same snapshot), then places shares one after another until none fits
and prints the thousandths placed against the free capacity (the fill ratio), for the part
placer's fragmentation choice and for plain best fit (least free left).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from market.core.parts import WHOLE, PartGpu, PartRequest  # noqa: E402
from scheduler.core.placement.parts import choose_parts, free_runs  # noqa: E402

PRICES = {"share": 700_000, "1g.10gb": 400_000, "3g.40gb": 1_200_000}


def fleet(gpus: int, rng: random.Random) -> list[PartGpu]:
    out = []
    for gid in range(gpus):
        slices, shares = (), ()
        if rng.random() < 0.5:
            if rng.random() < 0.25:
                slices = (("1g.10gb", rng.randrange(7)),)
            else:
                at, taken = 0, []
                while at < WHOLE:
                    width = rng.randrange(100, 501, 50)
                    if at + width > WHOLE or rng.random() < 0.3:
                        break
                    taken.append((at, at + width))
                    at += width
                shares = tuple(taken)
        out.append(PartGpu(id=gid, node=f"n{gid // 8:05d}", index=gid % 8, model="H100-80GB",
                           memory_mib=81_559, slices=slices, shares=shares, part_prices=PRICES))
    return out


def timed(gpus, request, repeats) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        placed = choose_parts(gpus, request)
        times.append((time.perf_counter() - started) * 1000)
        assert placed.placed, placed.reason
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))]


def fill(gpus: list[PartGpu], rng: random.Random, best_fit: bool) -> float:
    """Shares of random widths placed until one fits nowhere: thousandths placed / free."""
    state = {g.id: list(g.shares) for g in gpus if not g.slices}
    by_id = {g.id: g for g in gpus}
    free = sum(WHOLE - sum(b - a for a, b in s) for s in state.values())
    placed = 0
    while True:
        width = rng.choice([100, 125, 250, 250, 500, 500, 1000])
        if width == WHOLE:  # a whole GPU: any GPU with nothing on it
            empty = next((gid for gid, s in state.items() if not s), None)
            if empty is None:
                break
            state[empty].append((0, WHOLE))
            placed += WHOLE
            continue
        candidates = [PartGpu(id=gid, node=by_id[gid].node, index=by_id[gid].index,
                              model="H100-80GB", memory_mib=81_559, shares=tuple(s),
                              part_prices=PRICES) for gid, s in state.items()]
        if best_fit:
            roomy = [(min((b - a for a, b in free_runs(c.shares) if b - a >= width),
                          default=None), c.id) for c in candidates]
            roomy = [(left, gid) for left, gid in roomy if left is not None]
            if not roomy:
                break
            gid = min(roomy)[1]
            run = min((r for r in free_runs(state[gid]) if r[1] - r[0] >= width),
                      key=lambda r: (r[1] - r[0], r[0]))
            state[gid].append((run[0], run[0] + width))
        else:
            chosen = choose_parts(candidates, PartRequest(count=1, share=width))
            if not chosen.placed:
                break
            part = chosen.parts[0]
            state[part.gpu_id].append(part.span)
        placed += width
    return placed / free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    gpus = fleet(args.gpus, rng)
    print(f"parts bench: {args.gpus} shareable GPUs, half holding parts; "
          f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}")
    for label, request in [
            ("1 share of 250", PartRequest(count=1, share=250)),
            ("3 shares of 500 on one node", PartRequest(count=3, share=500)),
            ("1 x 1g.10gb", PartRequest(count=1, mig_profile="1g.10gb")),
            ("2 x 3g.40gb", PartRequest(count=2, mig_profile="3g.40gb"))]:
        median, p95 = timed(gpus, request, args.requests)
        print(f"  {label:<28} median {median:7.2f} ms   p95 {p95:7.2f} ms")
    small = fleet(800, random.Random(args.seed))
    for best_fit in (False, True):
        ratio = fill(small, random.Random(args.seed + 1), best_fit)
        name = "best fit (least free left)" if best_fit else "part placer (fragmentation)"
        print(f"  fill until refused, 800 GPUs: {name:<28} {ratio:6.1%} of free placed")


if __name__ == "__main__":
    main()

"""The defragmentation planner on a synthetic fragmented pool (pure Python, no database).

    python bench/defrag_bench.py [--nodes 512] [--moves 20] [--seed 1]

Leaves of 16 nodes of 8 GPUs; each node has 0, 2, 4, 6 or 8 GPUs used (0 twice as likely), in
leases of 1, 2 or 4 GPUs, 60 % of them movable spot leases. Prints the plan's time and the
whole free leaves and nodes before and after.
"""

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.core.placement.defrag import GpuSlot, LeaseView, NodeView, plan_defrag  # noqa: E402


def pool(nodes: int, seed: int, movable: float):
    rng = random.Random(seed)
    views, leases = [], []
    for n in range(nodes):
        gpus = tuple(GpuSlot(n * 8 + i, price_micros=2_000_000) for i in range(8))
        views.append(NodeView(str(n), f"leaf{n // 16}", "H100-80GB", gpus))
        used, i = rng.choice([0, 0, 2, 4, 6, 8]), 0
        while i < used:
            size = min(rng.choice([1, 2, 4]), used - i)
            leases.append(LeaseView(len(leases) + 1, "H100-80GB",
                                    frozenset(g.id for g in gpus[i:i + size]),
                                    movable=rng.random() < movable, max_price_micros=2_000_000,
                                    ends_at=1e12))
            i += size
    return views, leases


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--movable", type=float, default=0.6, help="share of movable leases")
    args = parser.parse_args()
    nodes, leases = pool(args.nodes, args.seed, args.movable)
    began = time.perf_counter()
    plan = plan_defrag(nodes, leases, max_moves=args.moves)
    elapsed = time.perf_counter() - began
    print(f"{len(nodes)} nodes, {len(leases)} leases ({sum(x.movable for x in leases)} movable): "
          f"{len(plan.moves)} moves planned in {elapsed:.2f} s; whole free leaves "
          f"{plan.before.whole_free_leaves} -> {plan.after.whole_free_leaves}, whole free nodes "
          f"{plan.before.whole_free_nodes} -> {plan.after.whole_free_nodes}")


if __name__ == "__main__":
    main()

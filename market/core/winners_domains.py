"""Integer reasoning in the Lagrangian bound: each bid of a required domain level placed whole.

Pure numpy, no Django. The relaxation in `winners_solver.lagrangian_bound` lets a bid take its
GPUs from the cheapest-priced tier anywhere in its market; a bid that must sit in one leaf or
one spine cannot: it takes `gpus` GPUs of one domain, each GPU at most once. Under the same
multipliers (tier prices `pi`), its best such placement is

    max over domains D of its level: the sum of the `gpus` largest
        hours x (limit - reserve) - pi[tier of the GPU]
    over D's GPUs at or below its limit on nodes with at least its node need free,

which is at most the pooled answer (each GPU's term is at most the best tier's) and at least
the true value of any placement the bid can have less the prices of the GPUs it takes
(slices and runtimes only narrow the placements further). Keeping a bid's own placement
constraints in the Lagrangian subproblem keeps the bound valid for any non-negative
multipliers: the bound with these gains is still an upper bound on every feasible clearing.

GPUs of one domain with the same reserve on nodes of the same free count are one group (one
tier, one value for every bid), so a bid is weighed against domains x groups, not GPUs.

Priced this way, each bid picks its best domain alone, and the tier prices, one per reserve
and node size across the market, cannot tell a crowded domain from an empty one: on the
benchmark's 10,000 bids the relaxation put 221 leaf bids in 33 of 782 leaves (21 of them,
1,152 GPUs, in a leaf of 65 free GPUs). So each family (the bids of one level of one market)
also gets a row per domain: its bids there take at most `domain_capacities` GPUs between them
(the domain's free GPUs, in whole slices where all ask the same slice of a node, then the
largest sum of their sizes within that), valid for every feasible clearing; its price `rho`
per GPU is one more multiplier, and a bid's value in a domain is less `rho` x its GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from billing.core.money import MICROS_PER_DOLLAR
from market.core.clearing import NodeOffer, domain_key


@dataclass
class DomainGroups:
    """The GPUs of every domain of one level of one market, in groups padded to one width:
    `price[d, k]` the reserve, `tier[d, k]` the bound's tier, `node_class[d, k]` the free GPUs
    of the group's nodes, `count[d, k]` how many GPUs (0 for padding)."""

    price: object
    tier: object
    node_class: object
    count: object


def domain_groups(levels: Sequence[str], nodes: Sequence[NodeOffer], level: str,
                  tier_of: Mapping[tuple[int, int], int], grid: int,
                  keys: Sequence[tuple] | None = None) -> DomainGroups:
    """`tier_of[(reserve rounded down to grid, node free GPUs)]` -> the bound's tier index;
    `keys`: each node's domain at `level`, when known."""
    import numpy as np

    if keys is None:
        keys = [domain_key(node, levels, level) for node in nodes]
    index: dict[tuple, int] = {}
    domain_of = np.array([index.setdefault(key, len(index)) for key in keys], dtype=np.int64)
    sizes = np.array([len(node.reserve_micros) for node in nodes], dtype=np.int64)
    # one entry per free GPU: (domain, reserve, its node's free GPUs) as one sortable key
    reserves, reserve_at = np.unique(np.fromiter(
        (p for node in nodes for p in node.reserve_micros), dtype=np.int64,
        count=int(sizes.sum())), return_inverse=True)
    free = np.repeat(sizes, sizes)
    top = int(free.max()) + 1 if len(free) else 1
    key = (np.repeat(domain_of, sizes) * len(reserves) + reserve_at) * top + free
    unique, gpus = np.unique(key, return_counts=True)  # by domain, reserve, size
    rows = np.stack([unique // top // max(len(reserves), 1),
                     reserves[unique // top % max(len(reserves), 1)] if len(reserves)
                     else unique, unique % top], axis=1)
    first = np.searchsorted(rows[:, 0], np.arange(len(index)))
    column = np.arange(len(rows)) - first[rows[:, 0]]
    width = int(column.max()) + 1 if len(rows) else 0
    shape = (len(index), max(width, 1))
    price = np.zeros(shape)
    tier = np.zeros(shape, dtype=np.int64)
    node_class = np.zeros(shape, dtype=np.int64)
    count = np.zeros(shape)
    price[rows[:, 0], column] = rows[:, 1]
    node_class[rows[:, 0], column] = rows[:, 2]
    count[rows[:, 0], column] = gpus
    tier[rows[:, 0], column] = [tier_of[(int(reserve) // grid * grid, int(free))]
                                for reserve, free in rows[:, 1:]]
    return DomainGroups(price, tier, node_class, count)


def whole_gains(groups: DomainGroups, pi, hours, limit, gpus, need, rho=None):
    """Per bid (arrays over bids): the best placement's value beyond the tier prices (and the
    domain's price `rho[d]` per GPU placed there, when given), in dollars (-inf where no
    domain holds it), what it takes as (bid, tier, GPUs) arrays, and the domain it takes
    (-1: none).

    A group's value to a bid is hours x (limit - reserve) - pi: its order within a domain
    depends on the bid's hours only (cost = hours x reserve + pi), so the groups are sorted
    once per distinct hours and each bid takes the cheapest open GPUs of each domain."""
    import numpy as np

    best = np.full(len(hours), -np.inf)
    where = np.full(len(hours), -1)
    parts: list[tuple] = []
    tier_price = pi[groups.tier]
    total = groups.count.sum(axis=1)
    for h in np.unique(hours):
        bids = np.flatnonzero(hours == h)
        domains = np.flatnonzero(total >= gpus[bids].min())  # the others hold none of them
        if not len(domains):
            continue
        cost = h * groups.price[domains] / MICROS_PER_DOLLAR + tier_price[domains]
        cost = np.where(groups.count[domains] > 0, cost, np.inf)
        order = np.argsort(cost, axis=1)
        cost = np.take_along_axis(cost, order, axis=1)
        count = np.take_along_axis(groups.count[domains], order, axis=1)
        price = np.take_along_axis(groups.price[domains], order, axis=1)
        node_class = np.take_along_axis(groups.node_class[domains], order, axis=1)
        tier = np.take_along_axis(groups.tier[domains], order, axis=1)
        # the bids whose limit clears every reserve here share their open GPUs (those on
        # nodes that hold their need): one running count and cost per domain serves them all
        full = limit[bids] >= (price[count > 0].max() if (count > 0).any() else 0.0)
        for need_at in np.unique(need[bids[full]]):
            mine = bids[full & (need[bids] == need_at)]
            _shared_gains(mine, h, cost, count, node_class >= need_at, tier, domains, limit,
                          gpus, rho, best, where, parts)
        bids = bids[~full]
        if not len(bids):
            continue
        open_ = ((price[None] <= limit[bids, None, None])
                 & (node_class[None] >= need[bids, None, None]))
        usable = np.where(open_, count[None], 0.0)
        before = np.cumsum(usable, axis=2) - usable
        take = np.clip(gpus[bids, None, None] - before, 0.0, usable)
        worth = h * limit[bids, None] / MICROS_PER_DOLLAR  # per GPU, before its cost
        gain = (take * np.where(take > 0, worth[:, :, None] - cost[None], 0.0)).sum(axis=2)
        if rho is not None:
            gain = gain - rho[domains][None, :] * gpus[bids, None]
        gain = np.where(usable.sum(axis=2) >= gpus[bids, None], gain, -np.inf)
        domain = np.argmax(gain, axis=1)
        best[bids] = gain[np.arange(len(bids)), domain]
        where[bids] = np.where(np.isfinite(best[bids]), domains[domain], -1)
        taken = take[np.arange(len(bids)), domain]  # bids x groups
        bid, group = np.nonzero(taken)
        parts.append((bids[bid], tier[domain[bid], group], taken[bid, group]))
    if not parts:
        return best, (np.zeros(0, dtype=np.int64),) * 2 + (np.zeros(0),), where
    return best, tuple(np.concatenate(arrays) for arrays in zip(*parts, strict=True)), where


def domain_capacities(levels: Sequence[str], nodes: Sequence[NodeOffer], level: str,
                      shapes, keys: Sequence[tuple] | None = None) -> object:
    """Per domain of `level`, in `domain_groups`' order: the most GPUs the given shapes can
    take there between them. The free GPUs of its nodes (in whole slices, where every shape
    asks for the same slice of a node), and then the largest sum of their sizes within that
    (`most_packed`): every feasible clearing's bids of these shapes in the domain hold their
    GPUs there, each GPU once."""
    import numpy as np

    slices = {(shape.topology.slice_size or 1) if (shape.topology.slice_level or levels[-1])
              == levels[-1] else 1 for shape in shapes}
    size = slices.pop() if len(slices) == 1 else 1
    if keys is None:
        keys = [domain_key(node, levels, level) for node in nodes]
    free: dict[tuple, int] = {}
    for node, key in zip(nodes, keys, strict=True):
        free[key] = free.get(key, 0) + node.free_gpus // size * size
    sizes = sorted({shape.gpus for shape in shapes})
    packed: dict[int, int] = {}
    for gpus in free.values():
        if gpus not in packed:
            packed[gpus] = most_packed(gpus, sizes)
    return np.array([float(packed[gpus]) for gpus in free.values()])


def _shared_gains(bids, h, cost, count, open_, tier, domains, limit, gpus, rho, best, where,
                  parts) -> None:
    """`whole_gains` for bids of `h` hours that may all take the same GPUs (`open_`, domains
    x groups sorted by cost): the cheapest g of a domain from running totals, so each bid
    costs domains x groups comparisons, not a deal of its own."""
    import numpy as np

    usable = np.where(open_, count, 0.0)
    running = np.cumsum(usable, axis=1)
    spent = np.cumsum(usable * np.where(usable > 0, cost, 0.0), axis=1)
    rows = np.arange(len(domains))[None, :]
    zero = np.zeros((len(domains), 1))
    running_before = np.concatenate([zero, running], axis=1)
    spent_before = np.concatenate([zero, spent], axis=1)
    unit = np.where(usable > 0, cost, 0.0)
    g = gpus[bids]
    at = (running[None] < g[:, None, None]).sum(axis=2)  # the group of each bid's last GPU
    at = np.minimum(at, usable.shape[1] - 1)
    paid = spent_before[rows, at] + (g[:, None] - running_before[rows, at]) * unit[rows, at]
    gain = h * limit[bids, None] * g[:, None] / MICROS_PER_DOLLAR - paid
    if rho is not None:
        gain = gain - rho[domains][None, :] * g[:, None]
    gain = np.where(running[:, -1][None, :] >= g[:, None], gain, -np.inf)
    domain = np.argmax(gain, axis=1)
    best[bids] = gain[np.arange(len(bids)), domain]
    where[bids] = np.where(np.isfinite(best[bids]), domains[domain], -1)
    taken = np.clip(g[:, None] - (running[domain] - usable[domain]), 0.0, usable[domain])
    bid, group = np.nonzero(taken)
    parts.append((bids[bid], tier[domain[bid], group], taken[bid, group]))


class WholeDomains:
    """The bids of the relaxation that must sit in one domain of a level between the market
    and the node, with their domains' groups, to price each placed whole (`whole_gains`)."""

    def __init__(self, levels: Sequence[str], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
                 options, chosen: Sequence[int], tier_index: Mapping[tuple, int], grid: int,
                 need, hours, limit, gpus) -> None:
        import numpy as np

        self.families: list[tuple[DomainGroups, object]] = []  # (groups, rows of chosen)
        rows_of: dict[tuple[str, str], list[int]] = {}
        for row, i in enumerate(chosen):
            required = options[i].shape.topology.required
            if required is not None and required != levels[-1]:
                rows_of.setdefault((options[i].market, required), []).append(row)
        caps = []
        for (market, level), rows in rows_of.items():
            tier_of = {(price, free): tier for (m, price, free), tier in tier_index.items()
                       if m == market}
            nodes = nodes_by_market[market]
            keys = [domain_key(node, levels, level) for node in nodes]
            groups = domain_groups(levels, nodes, level, tier_of, grid, keys)
            self.families.append((groups, np.array(rows), sum(len(c) for c in caps)))
            caps.append(domain_capacities(levels, nodes, level,
                                          [options[chosen[row]].shape for row in rows], keys))
        # each family's bids in one domain take at most `capacity[d]` GPUs between them: a
        # price `rho[d]` per GPU on that row (a multiplier like the tiers')
        self.capacity = np.concatenate(caps) if caps else np.zeros(0)
        self.need, self.hours, self.limit, self.gpus = need, hours, limit, gpus

    def gains(self, pi, gain, penalty, rho):
        """`gain` with each bid of a domain whose pooled gain is positive priced whole (a
        bid at or below zero stays: whole it would gain no more: `rho` only lowers it); for
        those bids, the GPUs their placement takes per tier, as (rows, tiers, GPUs) arrays;
        and each bid's domain row (an index into `capacity`; -1: none, or not priced whole)."""
        import numpy as np

        gain = gain.copy()
        placed = np.full(len(gain), -1)
        rows_out, tiers_out, gpus_out = [], [], []
        for groups, rows, first in self.families:
            rows = rows[gain[rows] > 0]
            if not len(rows):
                continue
            domains = len(groups.count)
            best, (bid, tiers, taken), where = whole_gains(
                groups, pi, self.hours[rows], self.limit[rows], self.gpus[rows], self.need[rows],
                rho[first:first + domains])
            gain[rows] = np.where(np.isfinite(best), best - penalty[rows], 0.0)
            placed[rows] = np.where(where >= 0, where + first, -1)
            rows_out.append(rows[bid])
            tiers_out.append(tiers)
            gpus_out.append(taken)
        if not rows_out:
            return gain, (np.zeros(0, dtype=np.int64),) * 2 + (np.zeros(0),), placed
        return gain, (np.concatenate(rows_out), np.concatenate(tiers_out),
                      np.concatenate(gpus_out)), placed


def most_packed(free: int, sizes: Sequence[int]) -> int:
    """The largest total of bid sizes (each size any number of times) at or below `free`: what
    a domain with `free` GPUs can hold of bids of these sizes. Tighter than `free` itself: a
    spine with 304 whole-node GPUs holds 256 of 128- and 256-GPU bids, not 304."""
    reachable, mask = 1, (1 << (free + 1)) - 1
    for size in sizes:
        shift = size
        while shift <= free:  # doubling shifts add every multiple of the size
            reachable |= (reachable << shift) & mask
            shift *= 2
    return reachable.bit_length() - 1

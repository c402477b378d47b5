"""HiGHS for winner determination: the exact integer programme and the relaxation bound.

Pure Python and numpy, no Django; floats live only in here, and every answer is re-priced
exactly by the caller (`winners.py`).

`solve_mip`: the whole problem for a book that is small enough, over the options of the orders
(one per alternative and market): a binary `accept` per option, at most one per order; integer
`take` per (option, node, reserve tier), the tier's GPUs on that node as capacity; all or
nothing (`takes = gpus x accept`); a required level as one binary per domain; slices as an
integer count of slices per domain of the slice level. Its dual bound is a valid upper bound
on the optimum even when the time limit stops it.

`lagrangian_bound`: for books too big for the integer programme, an upper bound from a
Lagrangian relaxation. GPUs are pooled in tiers (market, reserve rounded down to `GRID`
micro-dollars, the free GPUs of their node); a bid may use a tier at or below its limit whose
nodes hold at least what it needs of one node (all its GPUs for a `node` bid, a slice for
whole-node slices). Bids of a required `leaf`/`spine`... level are further held by two
counts per size G: no more bids of at least G GPUs than the domains can hold
(sum over domains of floor(free / G)), and no more of their GPUs than the domains can hold of
those sizes (sum over domains of the largest sum of such sizes within free, `most_packed`). Each constraint gets a multiplier (tier prices `pi`, row prices `mu`), and for any
non-negative multipliers
    bound = sum of capacity x pi + sum of row limit x mu + sum over orders of
            max(0, max over options of (gpus x max over usable tiers (value - pi) - rows' mu))
is an upper bound on the welfare of every feasible clearing (weak duality): rounding reserves
down and every relaxation only raise it. The multipliers are improved by subgradient steps
(Polyak's rule against the incumbent) until the deadline; the best bound seen is returned.
In a second phase the bids of a leaf or spine are priced placed whole in one domain, with a
price per domain on what their family takes there (`winners_domains`).
Each step finds a bid's best tier over reserves, not tiers (`_CheapestTier`), so thousands fit.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from billing.core.money import MICROS_PER_DOLLAR
from market.core.clearing import NodeOffer, domain_key
from market.core.winners_domains import WholeDomains, most_packed
from market.core.winners_search import Option, Sale


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """HiGHS prints a banner on C-level stdout the first time a solver is built; keep it off
    stdout, which the JSON commands own."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _highs(time_limit_s: float):
    import highspy

    with quiet_stdout():
        solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("threads", 1)
    solver.setOptionValue("time_limit", max(0.01, float(time_limit_s)))
    return solver


def _counts(prices: Sequence[int]) -> list[tuple[int, int]]:
    counts: dict[int, int] = {}
    for price in prices:
        counts[price] = counts.get(price, 0) + 1
    return sorted(counts.items())


@dataclass
class MipAnswer:
    feasible: bool
    optimal: bool
    bound: float  # dollars; an upper bound on the optimum (inf when none is known)
    sales: list[Sale] = field(default_factory=list)


def mip_size(nodes_by_market: Mapping[str, Sequence[NodeOffer]],
             options: Sequence[Option], stop_above: int) -> int:
    """The number of `take` columns the integer programme would have (counted up to just
    past `stop_above`)."""
    tiers = {market: sorted(price for node in nodes for price, _ in _counts(node.reserve_micros))
             for market, nodes in nodes_by_market.items()}
    size = 0
    for option in options:
        size += bisect.bisect_right(tiers.get(option.market, []), option.shape.limit_micros)
        if size > stop_above:
            break
    return size


def solve_mip(
    levels: Sequence[str],
    nodes_by_market: Mapping[str, Sequence[NodeOffer]],
    options: Sequence[Option],
    time_limit_s: float,
    start: Sequence[Sale] = (),
    forced: int | None = None,
    limits: Mapping[int, int] | None = None,
) -> MipAnswer:
    """The welfare-maximising sales. `forced`: that option must win; `limits`: limits to use
    instead of the options' own (the reserves a shape may take are at or below its limit)."""
    import highspy
    import numpy as np

    limits = limits or {}
    cost: list[float] = []
    upper: list[float] = []
    rows: list[tuple[float, float, dict[int, float]]] = []
    inf = highspy.kHighsInf

    def column(objective: float, ub: float) -> int:
        cost.append(objective)
        upper.append(ub)
        return len(cost) - 1

    tiers = {market: {node.name: _counts(node.reserve_micros) for node in nodes}
             for market, nodes in nodes_by_market.items()}
    capacity: dict[tuple[str, str, int], dict[int, float]] = {}
    accept_of: list[int] = []
    takes: list[tuple[int, int, str, int]] = []  # (column, option, node, price)
    domain_columns: dict[int, dict[tuple, int]] = {}
    slice_columns: dict[int, dict[tuple, int]] = {}
    by_order: dict[int, list[int]] = {}
    for index, option in enumerate(options):
        shape = option.shape
        limit = limits.get(index, shape.limit_micros)
        nodes = nodes_by_market.get(option.market, ())
        accept = column(0.0, 1.0)
        accept_of.append(accept)
        by_order.setdefault(option.order, []).append(accept)
        per_node: dict[str, list[int]] = {}
        for node in nodes:
            if shape.runtimes is not None and node.runtime not in shape.runtimes:
                continue
            for price, count in tiers[option.market][node.name]:
                if price > limit:
                    break
                value = float((limit - price) * shape.hours) / MICROS_PER_DOLLAR
                take = column(value, float(min(count, shape.gpus)))
                takes.append((take, index, node.name, price))
                per_node.setdefault(node.name, []).append(take)
                capacity.setdefault((option.market, node.name, price), {})[take] = 1.0
        everything = {take: 1.0 for group in per_node.values() for take in group}
        rows.append((0.0, 0.0, {**everything, accept: -float(shape.gpus)}))
        topology = shape.topology
        if topology.required is not None:
            choices = {}
            domain_columns[index] = {}
            for domain, members in _group(nodes, levels, topology.required).items():
                inside = {take: 1.0 for node in members for take in per_node.get(node.name, [])}
                if not inside:
                    continue
                chosen = column(0.0, 1.0)
                domain_columns[index][domain] = chosen
                choices[chosen] = 1.0
                rows.append((-inf, 0.0, {**inside, chosen: -float(shape.gpus)}))
            rows.append((0.0, 0.0, {**choices, accept: -1.0}))
        if topology.slice_size is not None and topology.slice_size > 1:
            slice_level = topology.slice_level or levels[-1]
            slice_columns[index] = {}
            for domain, members in _group(nodes, levels, slice_level).items():
                inside = {take: 1.0 for node in members for take in per_node.get(node.name, [])}
                if inside:
                    groups = column(0.0, float(shape.gpus // topology.slice_size))
                    slice_columns[index][domain] = groups
                    rows.append((0.0, 0.0, {**inside, groups: -float(topology.slice_size)}))
    for accepts in by_order.values():
        if len(accepts) > 1:
            rows.append((-inf, 1.0, dict.fromkeys(accepts, 1.0)))
    counts = {(market, name): dict(node_tiers)
              for market, market_tiers in tiers.items() for name, node_tiers in market_tiers.items()}
    for (market, name, price), members in capacity.items():
        rows.append((-inf, float(counts[(market, name)][price]), members))
    if not cost:
        return MipAnswer(forced is None, True, 0.0)

    solver = _highs(time_limit_s)
    solver.setOptionValue("mip_rel_gap", 0.0)
    n = len(cost)
    lower = np.zeros(n)
    if forced is not None:
        lower[accept_of[forced]] = 1.0
    empty = np.array([], dtype=np.int32)
    solver.addCols(n, np.array(cost), lower, np.array(upper), 0, empty, empty,
                   np.array([], dtype=np.float64))
    solver.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                                 np.array([highspy.HighsVarType.kInteger] * n))
    for low, high, coefficients in rows:
        indices = np.array(list(coefficients), dtype=np.int32)
        values = np.array(list(coefficients.values()), dtype=np.float64)
        solver.addRow(low, high, len(indices), indices, values)
    solver.changeObjectiveSense(highspy.ObjSense.kMaximize)
    if start and forced is None:
        _give_start(solver, n, start, options, levels, nodes_by_market, accept_of, takes,
                    domain_columns, slice_columns)
    solver.run()
    info = solver.getInfo()
    optimal = solver.getModelStatus() == highspy.HighsModelStatus.kOptimal
    if solver.getModelStatus() == highspy.HighsModelStatus.kInfeasible:
        return MipAnswer(False, True, 0.0)
    bound = float(info.mip_dual_bound) if not optimal else float(info.objective_function_value)
    if optimal:
        bound = max(bound, float(info.mip_dual_bound))
    if info.primal_solution_status != 2:
        return MipAnswer(False, False, bound)
    values = solver.getSolution().col_value
    plans: dict[int, dict[str, list[int]]] = {}
    for take, index, name, price in takes:
        gpus = round(values[take])
        if gpus:
            plans.setdefault(index, {}).setdefault(name, []).extend([price] * gpus)
    sales = []
    for index, accept in enumerate(accept_of):
        if round(values[accept]) == 1:
            plan = plans.get(index, {})
            reserves = {name: tuple(sorted(prices)) for name, prices in plan.items()}
            sales.append(Sale(index, {name: len(p) for name, p in reserves.items()}, reserves))
    return MipAnswer(True, optimal, bound, sales)


def _give_start(solver, n, start, options, levels, nodes_by_market, accept_of, takes,
                domain_columns, slice_columns) -> None:
    """The greedy sales as the integer programme's first incumbent."""
    import numpy as np

    values = np.zeros(n)
    take_of = {(index, name, price): take for take, index, name, price in takes}
    offers = {node.name: node for nodes in nodes_by_market.values() for node in nodes}
    for sale in start:
        option = options[sale.option]
        values[accept_of[sale.option]] = 1.0
        for name, prices in sale.reserves_micros.items():
            for price in prices:
                values[take_of[(sale.option, name, price)]] += 1.0
        topology = option.shape.topology
        names = list(sale.assignment)
        if topology.required is not None:
            domain = domain_key(offers[names[0]], levels, topology.required)
            values[domain_columns[sale.option][domain]] = 1.0
        if sale.option in slice_columns:
            slice_level = topology.slice_level or levels[-1]
            for name, gpus in sale.assignment.items():
                domain = domain_key(offers[name], levels, slice_level)
                values[slice_columns[sale.option][domain]] += gpus / topology.slice_size
    with contextlib.suppress(Exception):  # a start HiGHS cannot use is only a lost hint
        solution = solver.getSolution()
        solution.col_value = list(values)
        solution.value_valid = True
        solver.setSolution(solution)


def _group(nodes: Sequence[NodeOffer], levels: Sequence[str], level: str) -> dict:
    groups: dict[tuple[str, ...], list[NodeOffer]] = {}
    for node in nodes:
        groups.setdefault(domain_key(node, levels, level), []).append(node)
    return groups


# --- the relaxation bound ------------------------------------------------------------------


GRID = 50_000  # tiers pool reserves rounded down to 5 cents (a valid relaxation)
# the share of the bound's time spent pricing leaf and spine bids whole: the pooled prices
# have all but converged within the first 30 % on the benchmark's 10,000 bids, while each
# whole step still lowers the bound (0.7 against 0.5: $1.0k lower in 3.6 s)
WHOLE_SHARE = 0.7
WHOLE_AFTER_STEPS = 20  # pooled steps before it starts
WHOLE_STEP_COST = 60  # the time left it needs, in pooled steps (a few of its own)
WHOLE_SCALE = 0.05  # the step scale the second phase starts from (its rows' slack is large)
WHOLE_STALE = 2  # steps without a better bound before it halves (only a few fit)


def node_need(option: Option, levels: Sequence[str]) -> int:
    """The fewest free GPUs a node must have for the option to use any of its GPUs."""
    topology = option.shape.topology
    if topology.required == levels[-1]:
        return option.shape.gpus
    size = topology.slice_size or 1
    if size > 1 and (topology.slice_level or levels[-1]) == levels[-1]:
        return size
    return 1


@dataclass
class Shadow:
    """What the bound's multipliers say about one market: per tier (price, node class,
    shadow price in dollars per GPU over a bid's hours)."""

    prices: list[int]
    classes: list[int]
    pi: list[float]


def _slot_rows(levels, nodes_by_market, options, chosen):
    """(members, per-GPU?, limit) rows: bids of a required level above the node, per size."""
    import numpy as np

    families: dict[tuple, list[int]] = {}
    for row, i in enumerate(chosen):
        option = options[i]
        topology = option.shape.topology
        if topology.required is None or topology.required == levels[-1]:
            continue
        size = topology.slice_size or 1
        slice_level = (topology.slice_level or levels[-1]) if size > 1 else None
        families.setdefault((option.market, topology.required, size, slice_level), []).append(row)
    rows = []
    for (market, level, size, slice_level), members in families.items():
        free: dict[tuple, int] = {}
        for node in nodes_by_market[market]:
            gpus = node.free_gpus
            if size > 1 and slice_level == levels[-1]:
                gpus = gpus // size * size
            key = domain_key(node, levels, level)
            free[key] = free.get(key, 0) + gpus
        sizes = sorted({options[chosen[row]].shape.gpus for row in members})
        domains_with = sorted(Counter(free.values()).items())  # (free GPUs, domains)
        for at, gpus in enumerate(sizes):
            rows_in = np.array([row for row in members if options[chosen[row]].shape.gpus >= gpus])
            rows.append((rows_in, False, float(sum(f // gpus * n for f, n in domains_with))))
            rows.append((rows_in, True, float(sum(most_packed(f, sizes[at:]) * n
                                                  for f, n in domains_with))))
    return rows


def _starting_prices(cheapest, tier_price, cap, gpus, hours, limit):
    """Tier prices to start the subgradient from: what a marginal bidder of H hours and a
    limit of P would pay for each tier, H(P - reserve), the (H, P) of a coarse grid that gives
    the lowest bound (without the rows); far better than zero, which counts every bid whole.
    Each candidate is weighed by `cheapest` (`_CheapestTier`): bids x reserves, not tiers."""
    import numpy as np

    best = (np.inf, np.zeros(len(cap)))
    top = float(limit.max())
    low = float(tier_price.min())
    for marginal_hours in np.quantile(hours, [0.5, 0.7, 0.8, 0.9, 0.95, 1.0]):
        for marginal_limit in np.linspace(low, top, 9):
            pi = np.maximum(0.0, marginal_hours * (marginal_limit - tier_price)
                            / MICROS_PER_DOLLAR)
            _, per_gpu = cheapest.best(pi)
            gain = np.where(per_gpu > _NOWHERE, per_gpu, 0.0) * gpus
            bound = float(cap @ pi + gain[gain > 0].sum())
            if bound < best[0]:
                best = (bound, pi)
    return best[1]


_MISSING = 1e18  # the price of a tier that does not exist: no bid takes it
_NOWHERE = -1e17  # a gain below this: the bid may use no tier


class _CheapestTier:
    """Each bid's best tier under tier prices pi, without a bids x tiers matrix: a bid's value
    per GPU depends only on the tier's reserve, and the node classes it may use are those at or
    above its need, so the best tier at each reserve is the class at or above the need with the
    lowest pi (a suffix minimum over classes). A bid of H hours then takes the reserve r, among
    those at or below its limit, with the least H x r + that price: the same for every bid of
    the same market, need, hours and highest reserve it may take, so one table of running
    best reserves (markets x classes x distinct hours x reserves) answers every bid, and a
    step costs O(bids), not bids x tiers."""

    def __init__(self, tier_market, tier_price, tier_class, market_of, need, hours, limit):
        import numpy as np

        self.prices = np.unique(tier_price)
        self.classes = np.unique(tier_class)
        markets = int(tier_market.max()) + 1
        self.tier_at = np.full((markets, len(self.prices), len(self.classes)), -1)
        self.tier_at[tier_market, np.searchsorted(self.prices, tier_price),
                     np.searchsorted(self.classes, tier_class)] = np.arange(len(tier_price))
        self.present = self.tier_at >= 0
        self.market_of = market_of
        # the first class at or above each bid's need (past the last: the bid fits no node)
        self.need_at = np.minimum(np.searchsorted(self.classes, need), len(self.classes) - 1)
        # the dearest reserve each bid may take (-1: none, or it fits no node)
        self.top = np.searchsorted(self.prices, limit, side="right") - 1
        self.top[np.searchsorted(self.classes, need) >= len(self.classes)] = -1
        self.hour_values, self.hour_at = np.unique(hours, return_inverse=True)
        # each bid's row of the table (markets x classes x hours, reserves), and its worth
        self.cell = ((market_of * len(self.classes) + self.need_at) * len(self.hour_values)
                     + self.hour_at) * len(self.prices)
        self.worth = hours * limit / MICROS_PER_DOLLAR

    def best(self, pi):
        """(tier, value - pi of that tier per GPU) of each bid; a value below `_NOWHERE`: no
        tier is open to the bid."""
        import numpy as np

        price = np.where(self.present, pi[np.maximum(self.tier_at, 0)], _MISSING)
        lowest = price.copy()
        at = np.broadcast_to(np.arange(len(self.classes)), price.shape).copy()
        for c in range(len(self.classes) - 2, -1, -1):  # suffix minimum over the classes
            later = lowest[:, :, c + 1] < lowest[:, :, c]
            lowest[:, :, c] = np.where(later, lowest[:, :, c + 1], lowest[:, :, c])
            at[:, :, c] = np.where(later, at[:, :, c + 1], at[:, :, c])
        # score[m, c, h, r] = -(hours x reserve + price): the best reserve at or below each r
        score = -(self.hour_values[None, None, :, None] * self.prices[None, None, None, :]
                  / MICROS_PER_DOLLAR + lowest.transpose(0, 2, 1)[:, :, None, :])
        running = np.maximum.accumulate(score, axis=3)
        reserves = np.arange(len(self.prices))
        best_at = np.maximum.accumulate(np.where(score >= running, reserves, 0), axis=3)
        m = np.arange(len(lowest))[:, None, None, None]
        c = np.arange(len(self.classes))[None, :, None, None]
        tier = self.tier_at[m, best_at, at[m, best_at, c]]
        cell = self.cell + np.maximum(self.top, 0)
        reduced = self.worth + running.ravel()[cell]  # hours x (limit - reserve) - price
        reduced = np.where(self.top >= 0, reduced, -_MISSING)
        return np.maximum(tier.ravel()[cell], 0), reduced


def _room_for_whole(steps: int, step_seconds: float, left: float) -> bool:
    """Whether to start pricing bids whole: after some pooled steps (they set the prices it
    starts from), and with time for a few of its steps, each some 20 pooled ones at full
    scale."""
    return steps > WHOLE_AFTER_STEPS and left > WHOLE_STEP_COST * step_seconds


def lagrangian_bound(
    levels: Sequence[str],
    nodes_by_market: Mapping[str, Sequence[NodeOffer]],
    options: Sequence[Option],
    usable: Sequence[bool],
    deadline: float,
    incumbent: float,
    whole_share: float = WHOLE_SHARE,
) -> tuple[float, dict[str, Shadow], dict[int, float], dict[int, float]]:
    """An upper bound (dollars) on the welfare of any feasible clearing, each market's tier
    shadow prices, each option's row price (dollars per bid) and its gain under the best
    multipliers (its value beyond them, a leaf or spine bid priced placed whole where the
    second phase ran; positive: the relaxation would take it). `usable[i]`
    false: option i fits nowhere alone, so it is left out (a valid restriction).
    `whole_share`: the share of the time left for the second phase, in which the bids of a
    leaf or spine are priced placed whole in one domain (`winners_domains`); it starts
    sooner when the pooled prices have converged."""
    import numpy as np

    tier_index: dict[tuple[str, int, int], int] = {}
    capacity: list[float] = []
    for market, nodes in nodes_by_market.items():
        for node in nodes:
            for price, count in _counts(node.reserve_micros):
                key = (market, price // GRID * GRID, node.free_gpus)
                if key not in tier_index:
                    tier_index[key] = len(capacity)
                    capacity.append(0.0)
                capacity[tier_index[key]] += count
    chosen = [i for i, ok in enumerate(usable) if ok and options[i].market in nodes_by_market]
    if not chosen or not capacity:
        return 0.0, {}, {}, {}
    tier_keys = list(tier_index)
    markets = sorted(nodes_by_market)
    tier_market = np.array([markets.index(k[0]) for k in tier_keys])
    tier_price = np.array([k[1] for k in tier_keys], dtype=np.float64)
    tier_class = np.array([k[2] for k in tier_keys])
    cap = np.array(capacity)
    hours = np.array([float(options[i].shape.hours) for i in chosen])
    limit = np.array([options[i].shape.limit_micros for i in chosen], dtype=np.float64)
    gpus = np.array([options[i].shape.gpus for i in chosen], dtype=np.float64)
    need = np.array([node_need(options[i], levels) for i in chosen])
    market_of = np.array([markets.index(options[i].market) for i in chosen])
    order_ids = np.array([options[i].order for i in chosen])
    rows = _slot_rows(levels, nodes_by_market, options, chosen)
    row_limit = np.array([limit_ for _, _, limit_ in rows])
    # the first option of each order, options sorted by order: per-order maxima by reduceat
    by_order = np.argsort(order_ids, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(order_ids[by_order]) != 0])
    cheapest = _CheapestTier(tier_market, tier_price, tier_class, market_of, need, hours, limit)
    pi = _starting_prices(cheapest, tier_price, cap, gpus, hours, limit)
    mu = np.zeros(len(rows))
    rho = np.zeros(0)  # per domain row of the bids priced whole (`WholeDomains.capacity`)
    best = (np.inf, pi.copy(), mu.copy(), rho)
    step_scale, stale = 1.0, 0
    whole = None  # the second phase: bids of a leaf or spine priced placed whole
    whole_from = deadline - whole_share * max(0.0, deadline - time.perf_counter())
    step_started, steps = time.perf_counter(), 0
    while True:
        step_seconds, step_started = time.perf_counter() - step_started, time.perf_counter()
        steps += 1
        if (whole is None and whole_share > 0 and whole_from < step_started
                and _room_for_whole(steps, step_seconds, deadline - step_started)):
            whole = WholeDomains(levels, nodes_by_market, options, chosen, tier_index, GRID,
                                 need, hours, limit, gpus)
            if not whole.families:
                break
            bound, pi, mu, _ = best
            rho = np.zeros(len(whole.capacity))
            step_scale, stale = WHOLE_SCALE, 0
        penalty = np.zeros(len(chosen))
        for (members, per_gpu, _), price in zip(rows, mu, strict=True):
            if price:
                penalty[members] += price * gpus[members] if per_gpu else price
        tier, per_gpu_gain = cheapest.best(pi)
        gain = np.where(per_gpu_gain > _NOWHERE, gpus * per_gpu_gain - penalty, 0.0)
        if whole is not None:
            gain, (whole_rows, whole_tiers, whole_gpus), placed = whole.gains(
                pi, gain, penalty, rho)
        sorted_gain = gain[by_order]
        order_best = np.maximum.reduceat(sorted_gain, starts)
        bound = float(cap @ pi + row_limit @ mu + np.maximum(order_best, 0.0).sum())
        if whole is not None:
            bound += float(whole.capacity @ rho)
        if bound < best[0] - 1e-6:
            best, stale = (bound, pi.copy(), mu.copy(), rho.copy()), 0
        else:
            stale += 1
            if stale > (WHOLE_STALE if whole is not None else 20):
                step_scale, stale = step_scale / 2, 0
        # stop when a step like the last would end past the deadline
        if time.perf_counter() + step_seconds > deadline or bound <= incumbent * 1.0001:
            break
        if step_scale < 1e-4:
            if whole is not None or whole_share <= 0 or not _room_for_whole(
                    steps, step_seconds, deadline - time.perf_counter()):
                break
            whole_from = 0.0  # the pooled prices have converged: price whole at once
            continue
        # the winning option of each order (its first maximum), if its gain is positive
        winner = np.zeros(len(chosen), dtype=bool)
        repeated = np.repeat(order_best, np.diff(np.r_[starts, len(chosen)]))
        is_max = (sorted_gain == repeated) & (repeated > 0)
        first = np.flatnonzero(is_max)
        if len(first):
            owner = np.searchsorted(starts, first, side="right") - 1
            _, keep = np.unique(owner, return_index=True)
            winner[by_order[first[keep]]] = True
        slack = cap.copy()
        if whole is None:
            np.subtract.at(slack, tier[winner], gpus[winner])
        else:  # a bid priced whole takes its placement's tiers, the rest their best tier
            pooled = winner.copy()
            pooled[whole_rows] = False
            np.subtract.at(slack, tier[pooled], gpus[pooled])
            taken = winner[whole_rows]
            np.subtract.at(slack, whole_tiers[taken], whole_gpus[taken])
        row_slack = np.array([limit_ - (gpus[members][winner[members]].sum() if per_gpu
                                        else winner[members].sum())
                              for members, per_gpu, limit_ in rows])
        domain_slack = np.zeros(0)
        if whole is not None:
            there = winner & (placed >= 0)
            domain_slack = whole.capacity - np.bincount(
                placed[there], weights=gpus[there], minlength=len(rho))
        # a multiplier at zero with room to spare stays at zero: left out of the step's norm
        slack[(pi <= 0) & (slack > 0)] = 0.0
        row_slack[(mu <= 0) & (row_slack > 0)] = 0.0
        domain_slack[(rho <= 0) & (domain_slack > 0)] = 0.0
        norm = float(slack @ slack + row_slack @ row_slack + domain_slack @ domain_slack)
        if norm <= 0:  # no multiplier can move: these prices are optimal for this phase
            if whole is not None or whole_share <= 0:
                break
            whole_from, steps = 0.0, max(steps, WHOLE_AFTER_STEPS + 1)
            continue
        step = step_scale * (bound - incumbent) / norm
        pi = np.maximum(0.0, pi - step * slack)
        mu = np.maximum(0.0, mu - step * row_slack)
        rho = np.maximum(0.0, rho - step * domain_slack)
    bound, pi, mu, rho = best
    penalty = np.zeros(len(chosen))
    for (members, per_gpu, _), price in zip(rows, mu, strict=True):
        penalty[members] += price * gpus[members] if per_gpu else price
    _, per_gpu_gain = cheapest.best(pi)
    gains = np.where(per_gpu_gain > _NOWHERE, gpus * per_gpu_gain - penalty, -np.inf)
    if whole is not None:
        # the second phase's own gains, each leaf and spine bid priced placed whole: its
        # picks seat $3k more on the benchmark's 10,000 bids than the pooled phase's
        if len(rho) != len(whole.capacity):  # no better bound in the second phase
            rho = np.zeros(len(whole.capacity))
        whole_gain, _, _ = whole.gains(pi, np.where(np.isfinite(gains), gains, 0.0), penalty,
                                       rho)
        gains = np.where(per_gpu_gain > _NOWHERE, whole_gain, -np.inf)
    shadow = {}
    for m, market in enumerate(markets):
        mask = tier_market == m
        shadow[market] = Shadow([int(p) for p in tier_price[mask]],
                                [int(c) for c in tier_class[mask]], list(pi[mask]))
    row_price: dict[int, float] = {}
    for (members, per_gpu, _), price in zip(rows, mu, strict=True):
        for row in members:
            option = chosen[row]
            row_price[option] = row_price.get(option, 0.0) + (
                price * float(gpus[row]) if per_gpu else price)
    return bound, shadow, row_price, {option: float(gain)
                                      for option, gain in zip(chosen, gains, strict=True)}

"""Exchanges: a losing bid of one leaf (or spine) wins in place of small winners.

Pure Python, no Django. The greedy (`winners_search`) places small bids first where their
welfare per GPU is highest, and they break up the leaves that a bid of 24 GPUs needs whole:
on a one-spine slice whose optimum HiGHS proves, the optimum refuses some 15 small winners to
take three more leaf bids. Re-solving one leaf with the rest fixed cannot find that, since
the small winners would have to go elsewhere. So, for each losing bid of a required level
above the node (no slices), by welfare per GPU:

- every domain of its level is ranked by what freeing its GPUs costs: its free GPUs first,
  then its *evictable* winners (a `node` bid or a bid free to go anywhere, no slices), the
  least welfare per GPU first (a curve per domain, cached until a sale touches it);
- in the cheapest few domains (`DOMAINS_PRICED`) the exchange is priced exactly: the bid
  takes the cheapest of the free GPUs and of the evicted winners' GPUs there, at or below its
  limit, on nodes that can run it; a winner none of whose GPUs it takes stays;
- the best of them is made, and each evicted winner is placed again (its own constraints,
  its limit, its runtimes) where it adds most: on free GPUs, or in place of evictable winners
  of less welfare per GPU than it had (among the `TARGETS` of least), which then lose. Every
  market's GPUs are usually all sold, so the chain ends in dropping the market's least
  valuable small winners for the leaf bid;
- the GPUs the chain left free (a displaced winner bigger than what displaced it) go to the
  losers, in value order, each where it adds most (at most `REFILL_TRIED` of them tried): on
  a one-spine slice whose optimum HiGHS proves, two leaf bids of 32 GPUs then win in place of
  an unconstrained 64-GPU winner and four small ones, which takes the welfare from 1.4 % to
  0.3 % below the optimum;
- the chain is kept when the welfare rose, and undone (a journal of every change) otherwise.

Each step keeps every constraint the incumbent keeps, so welfare only rises.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal

from market.core.clearing import NodeOffer
from market.core.winners_search import Option, Sale

# how many of the domains cheapest to free are priced exactly for each losing bid
DOMAINS_PRICED = 3
# how many of the evictable winners of least welfare per GPU an evicted winner may displace
TARGETS = 64
# how many losers are tried on the GPUs a chain left free
REFILL_TRIED = 200


class Exchanger:
    """One market's sales as GPUs held per node, with free GPUs, changed by exchanges."""

    def __init__(self, levels: Sequence[str], nodes: Sequence[NodeOffer],
                 options: Sequence[Option], sales: Sequence[Sale], won: set[int],
                 order: Sequence[int] = ()) -> None:
        self.order = order  # this market's options by value, for `refill`
        self.levels = tuple(levels)
        self.node_level = self.levels[-1]
        self.options = options
        self.runtime = {node.name: node.runtime for node in nodes}
        self.domain_of: dict[str, dict[str | None, tuple]] = {}
        self.members: dict[str | None, dict[tuple, list[str]]] = {None: {(): []}}
        for node in nodes:
            keys = {None: (), self.node_level: (node.name,)}
            for depth, level in enumerate(self.levels[:-1]):
                keys[level] = tuple(node.labels[name] for name in self.levels[:depth + 1])
            self.domain_of[node.name] = keys
            for level, key in keys.items():
                self.members.setdefault(level, {}).setdefault(key, []).append(node.name)
        self.free = {node.name: sorted(node.reserve_micros) for node in nodes}
        self.held: list[dict[str, list[int]] | None] = []
        self.option_at: list[int] = []
        self.values: list[Decimal] = []  # each position's welfare
        self.at: dict[str, set[int]] = {node.name: set() for node in nodes}
        self.version: dict[tuple, int] = {}
        self.curves: dict[tuple, tuple] = {}
        self.won = won  # the orders that win, in every market
        self.journal: list[tuple[int, dict | None]] = []
        for sale in sales:
            self._hold(sale.option, {name: list(prices)
                                     for name, prices in sale.reserves_micros.items()})
        self.journal.clear()
        self.targets: list[str] | None = None  # refreshed after each exchange kept

    # --- state: every change journaled, so that an exchange that does not pay is undone ---

    def _hold(self, option: int, plan: dict[str, list[int]]) -> int:
        self.held.append(None)
        self.option_at.append(option)
        shape = self.options[option].shape
        self.values.append(shape.hours * sum(shape.limit_micros - price
                                             for prices in plan.values() for price in prices))
        position = len(self.held) - 1
        self._restore(position, plan)
        return position

    def _restore(self, position: int, plan: dict[str, list[int]]) -> None:
        self.held[position] = plan
        for name, prices in plan.items():
            for price in prices:
                self.free[name].remove(price)
            self.at[name].add(position)
            self._touch(name)
        self.won.add(self.options[self.option_at[position]].order)
        self.journal.append((position, None))

    def _release(self, position: int) -> None:
        plan = self.held[position]
        self.held[position] = None
        for name, prices in plan.items():
            for price in prices:
                bisect.insort(self.free[name], price)
            self.at[name].discard(position)
            self._touch(name)
        self.won.discard(self.options[self.option_at[position]].order)
        self.journal.append((position, plan))

    def _undo(self, mark: int) -> None:
        """Undo the changes journaled since `mark`, last first."""
        while len(self.journal) > mark:
            position, plan = self.journal.pop()
            if plan is None:
                self._release(position)
            else:
                self._restore(position, plan)
            self.journal.pop()

    def _touch(self, name: str) -> None:
        for level, key in self.domain_of[name].items():
            self.version[(level, key)] = self.version.get((level, key), 0) + 1

    def welfare(self, position: int) -> Decimal:
        return self.values[position]  # a position's plan never changes

    def density(self, position: int) -> Decimal:
        return self.welfare(position) / self.options[self.option_at[position]].shape.gpus

    def sales(self) -> list[Sale]:
        result = []
        for option, plan in zip(self.option_at, self.held, strict=True):
            if plan is not None:
                reserves = {name: tuple(sorted(p)) for name, p in plan.items() if p}
                result.append(Sale(option, {name: len(p) for name, p in reserves.items()},
                                   reserves))
        return result

    def evictable(self, position: int) -> bool:
        topology = self.options[self.option_at[position]].shape.topology
        return ((topology.slice_size or 1) <= 1
                and topology.required in (None, self.node_level))

    # --- the cost of freeing a domain --------------------------------------------------

    def _curve(self, level: str, key: tuple) -> tuple[int, list[int], list[int]]:
        """(free GPUs, cumulative GPUs, cumulative welfare) of the domain's evictable winners,
        least welfare per GPU first: what freeing k GPUs there costs at least, roughly."""
        version = self.version.get((level, key), 0)
        cached = self.curves.get((level, key))
        if cached is not None and cached[0] == version:
            return cached[1:]
        names = self.members[level][key]
        free = sum(len(self.free[name]) for name in names)
        count: dict[int, int] = {}
        for name in names:
            for position in self.at[name]:
                if self.evictable(position):
                    count[position] = count.get(position, 0) + len(self.held[position][name])
        units = sorted((self.welfare(p) / gpus, gpus, self.welfare(p)) for p, gpus in count.items())
        gpus_so_far, welfare_so_far = [], []
        total_gpus, total_welfare = free, 0
        for _, gpus, welfare in units:
            total_gpus += gpus
            total_welfare += welfare
            gpus_so_far.append(total_gpus)
            welfare_so_far.append(total_welfare)
        self.curves[(level, key)] = (version, free, gpus_so_far, welfare_so_far)
        return free, gpus_so_far, welfare_so_far

    def _freeing_cost(self, level: str, key: tuple, gpus: int) -> float:
        free, gpus_so_far, welfare_so_far = self._curve(level, key)
        if free >= gpus:
            return 0
        at = bisect.bisect_left(gpus_so_far, gpus)
        return welfare_so_far[at] if at < len(welfare_so_far) else float("inf")

    # --- one exchange ------------------------------------------------------------------

    def _usable(self, name: str, option: Option) -> bool:
        runtimes = option.shape.runtimes
        return runtimes is None or self.runtime[name] in runtimes

    def take(self, index: int, names: Sequence[str], below: Decimal | None = None):
        """(welfare added, plan, displaced positions): option `index` on the cheapest of the
        free GPUs of `names` and of the GPUs of evictable winners there (those of welfare per
        GPU under `below`, when given), the least welfare per GPU evicted first; a winner none
        of whose GPUs it takes stays. None when it does not fit."""
        option = self.options[index]
        shape = option.shape
        names = [name for name in names if self._usable(name, option)]
        pool = [(price, name, -1) for name in names for price in self.free[name]
                if price <= shape.limit_micros]
        evictees: dict[int, list[tuple[int, str, int]]] = {}
        if len(pool) < shape.gpus and (below is None or below > 0):
            for name in names:
                for position in self.at[name]:
                    if self.evictable(position):
                        evictees.setdefault(position, []).extend(
                            (price, name, position) for price in self.held[position][name]
                            if price <= shape.limit_micros)
        ranked = sorted((self.density(p), p) for p, gpus in evictees.items() if gpus)
        for density, position in ranked:
            if len(pool) >= shape.gpus or (below is not None and density >= below):
                break
            pool.extend(evictees[position])
        if len(pool) < shape.gpus:
            return None
        chosen = sorted(pool)[:shape.gpus]
        displaced = sorted({position for _, _, position in chosen if position >= 0})
        value = shape.hours * sum(shape.limit_micros - price for price, _, _ in chosen)
        value -= sum(self.welfare(position) for position in displaced)
        plan: dict[str, list[int]] = {}
        for price, name, _ in chosen:
            plan.setdefault(name, []).append(price)
        return value, plan, displaced

    def _apply(self, index: int, taken) -> None:
        """Make `take`'s answer: its displaced winners lose, option `index` wins."""
        _, plan, displaced = taken
        for position in displaced:
            self._release(position)
        self._hold(index, plan)

    def exchange(self, index: int) -> Decimal:
        """Option `index` (a loser of one leaf or spine) in the domain cheapest to free, its
        evicted winners placed again where winners of less welfare per GPU (or free GPUs)
        are; kept when the welfare rises, undone otherwise. The welfare added."""
        shape = self.options[index].shape
        level = shape.topology.required
        ranked = sorted((self._freeing_cost(level, key, shape.gpus), key)
                        for key in self.members[level])
        best = None
        for cost, key in ranked[:DOMAINS_PRICED]:
            if cost == float("inf"):
                break
            found = self.take(index, self.members[level][key])
            if found is not None and (best is None or found[0] > best[0]):
                best = found
        if best is None or best[0] + sum(self.welfare(p) for p in best[2]) <= 0:
            return Decimal(0)
        mark = len(self.journal)
        # the evicted, most welfare per GPU first, each displacing only winners of less
        evicted = sorted(((self.density(p), self.option_at[p]) for p in best[2]), reverse=True)
        gain = best[0]
        self._apply(index, best)
        for density, option in evicted:
            gain += self.replace(option, density)
        gain += self.refill(mark)
        if gain > 0:
            self.journal.clear()
            self.targets = None
            return gain
        self._undo(mark)
        return Decimal(0)

    def replace(self, index: int, below: Decimal) -> Decimal:
        """Place the evicted option `index` again: on free GPUs or those of winners of less
        welfare per GPU than `below`, among the market's cheapest to free; the welfare
        added (net of what it displaced; 0 when nothing pays)."""
        level = self.options[index].shape.topology.required
        targets = self._targets()
        if level is None:
            found = self.take(index, targets, below)
        else:
            groups: dict[tuple, list[str]] = {}
            for name in targets:
                groups.setdefault(self.domain_of[name][level], []).append(name)
            found = None
            for key in groups:
                here = self.take(index, self.members[level][key], below)
                if here is not None and (found is None or here[0] > found[0]):
                    found = here
        if found is None or found[0] <= 0:
            return Decimal(0)
        self._apply(index, found)
        return found[0]

    def refill(self, mark: int) -> Decimal:
        """Losers, in value order, each where it adds most on the free GPUs of the nodes the
        chain since `mark` released GPUs on (none evicted); the welfare added."""
        touched = sorted({name for _, plan in self.journal[mark:] if plan for name in plan})
        free = sum(len(self.free[name]) for name in touched)
        room: dict[tuple, int] = {}  # free GPUs per (level, domain), until a loser is placed
        gain = Decimal(0)
        tried = 0
        for index in self.order:
            if free <= 0 or tried >= REFILL_TRIED:
                break
            option = self.options[index]
            shape = option.shape
            if (option.order in self.won or shape.gpus > free
                    or (shape.topology.slice_size or 1) > 1):
                continue
            tried += 1
            level = shape.topology.required
            if level is None:
                domains = [touched]
            else:
                keys = dict.fromkeys(self.domain_of[name][level] for name in touched
                                     if self.free[name])
                for key in keys:
                    if (level, key) not in room:
                        room[(level, key)] = sum(len(self.free[name])
                                                 for name in self.members[level][key])
                domains = [self.members[level][key] for key in keys
                           if room[(level, key)] >= shape.gpus]
            found = None
            for names in domains:
                here = self.take(index, names, below=Decimal(0))  # free GPUs only
                if here is not None and here[0] > 0 and (found is None or here[0] > found[0]):
                    found = here
            if found is not None:
                self._apply(index, found)
                gain += found[0]
                free -= shape.gpus
                room.clear()
        return gain

    def _targets(self) -> list[str]:
        """The nodes with free GPUs and those of the evictable winners of least welfare per
        GPU (`TARGETS` of them): where an evicted winner may go."""
        if self.targets is None:
            positions = [p for p, plan in enumerate(self.held)
                         if plan is not None and self.evictable(p)]
            cheapest = sorted(positions, key=self.density)[:TARGETS]
            names = {name for name, prices in self.free.items() if prices}
            names.update(name for p in cheapest for name in self.held[p])
            self.targets = sorted(names)
        return self.targets


def exchanges(levels: Sequence[str], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
              options: Sequence[Option], sales: Sequence[Sale], order: Sequence[int],
              stop: Callable[[], bool] = lambda: False) -> list[Sale]:
    """`sales` improved by exchanges (see the module notes): the losing options of a required
    level above the node, without slices, tried in `order` until `stop()`."""
    node_level = levels[-1]
    won = {options[sale.option].order for sale in sales}
    markets = {market: Exchanger(levels, nodes, options,
                                 [s for s in sales if options[s.option].market == market], won,
                                 [i for i in order if options[i].market == market])
               for market, nodes in nodes_by_market.items()}
    for index in order:
        option = options[index]
        topology = option.shape.topology
        if (option.order in won or option.market not in markets
                or topology.required in (None, node_level) or (topology.slice_size or 1) > 1):
            continue
        if stop():
            break
        markets[option.market].exchange(index)
    return [sale for exchanger in markets.values() for sale in exchanger.sales()]

"""The incumbent of winner determination: a reserve-aware greedy over plain data.

Pure Python, no Django. `winners.py` explains the problem; this module finds a good feasible
answer fast, at any scale, and is the first incumbent of the integer programme:

- bids (one option per alternative and market) are taken in a given order, each placed where
  its GPUs cost least: among the domains of its required level (the whole market when none is
  required), the one whose cheapest feasible GPUs (in slices where it asks for slices) have
  the lowest total reserve plus $1 per GPU the domain would have left (`LEFT_OVER_MICROS`:
  best fit, so that large free domains stay whole), then by name;
- a bid free to go anywhere takes the market's cheapest GPUs, and a bid of one leaf or spine
  without slices the domain's cheapest, but a node still whole (nothing sold, as many GPUs as
  the market's largest) counts `WHOLE_NODE_MICROS` more, so it is broken last: whole nodes are
  what `node` bids of a whole node and whole-node slices need;
- on a node a winner always takes the cheapest unsold GPUs, so what a node has sold is a
  prefix of its sorted reserves, as in `clearing.Stock`;
- a domain's cheapest placement is cached per bid shape in a heap and recomputed only when
  a sale touched the domain (a version per domain), so 10,000 bids over 12,500 nodes take
  seconds, not minutes.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from market.core.clearing import Bid, NodeOffer

# how many domains too dear for a bid's limit are looked past before giving up on it
LOOK_PAST = 256
# what a GPU left over in the chosen domain counts, in micro-dollars per hour, beside the
# reserves taken: $1 keeps large free domains whole for the big bids that need them (on the
# benchmark's 10,000 bids: +2.7 % welfare over the cheapest domain with best fit on ties)
LEFT_OVER_MICROS = 1_000_000
# what breaking a node still whole counts beside the reserves, for bids that could go
# elsewhere (on the benchmark's 10,000 bids: +1.3 % welfare for the first greedy, +0.4 % after
# everything else; $0.10 to $3 all within 0.3 % of each other)
WHOLE_NODE_MICROS = 1_000_000
# the same, for a second try of the relaxation-guided pass (`winners.clear_welfare`): its leaf
# bids, seated first, keep off the whole nodes its spine bids need ($1,746.0k against
# $1,743.3k on the benchmark's 10,000 bids; alone, it loses up to 3 % on smaller books, so
# both are tried and the better kept)
WHOLE_NODE_WIDE_MICROS = 5_000_000
# The relaxation's widest picks seated first (`clear_welfare`'s third guided pass): each whole
# node such a bid takes counts this much per free GPU left in its leaf (the domain one level
# below the bid's), so it empties the leaves with least room first and keeps the roomiest
# whole for the leaf bids that follow (+$4-8k on the benchmark's 10,000 bids)
ROOM_MICROS = 3_000_000
# ... and in the same pass, every GPU counts this much per free GPU of its leaf for the bids
# that take GPUs one by one (unconstrained bids, leaf and spine bids without slices): they
# fill the tight leaves first and break up the roomy ones last (+$0.1-2.8k on the benchmark's
# books; 10 cents lost $16k: reserves must still decide)
GPU_ROOM_MICROS = 30_000

Plan = dict[str, int]  # node -> GPUs


@dataclass(frozen=True)
class Option:
    """One way an order can win: one of its alternatives, in one market."""

    order: int  # index of the order in the clearing's input
    alternative: int  # index in the order's alternatives (0 for a bid of one shape)
    shape: Bid
    market: str


@dataclass(frozen=True)
class ShapeKey:
    level: str | None  # required level; None: anywhere in the market
    gpus: int
    slice_size: int  # 1: no slices
    slice_level: str | None
    runtimes: frozenset[str] | None


def shape_key(shape: Bid, levels: Sequence[str]) -> ShapeKey:
    topology = shape.topology
    size = topology.slice_size or 1
    slice_level = (topology.slice_level or levels[-1]) if size > 1 else None
    level = topology.required
    if size > 1 and level is not None and levels.index(slice_level) <= levels.index(level):
        size, slice_level = 1, None  # the whole bid sits in one slice domain anyway
    return ShapeKey(level, shape.gpus, size, slice_level, shape.runtimes)


class MarketStock:
    """The unsold GPUs of one market, with cached cheapest placements per bid shape."""

    def __init__(self, levels: Sequence[str], nodes: Sequence[NodeOffer],
                 whole_node_micros: int = WHOLE_NODE_MICROS, room_micros: int = 0,
                 gpu_room_micros: int = 0) -> None:
        self.whole_node_micros = whole_node_micros
        self.room_micros = room_micros
        self.gpu_room_micros = gpu_room_micros
        self.levels = tuple(levels)
        self.node_level = self.levels[-1]
        self.prices = {node.name: node.reserve_micros for node in nodes}
        self.runtime = {node.name: node.runtime for node in nodes}
        self.sold = dict.fromkeys(self.prices, 0)
        self.domains: dict[str, dict[tuple, list[str]]] = {}
        self.domain_of: dict[str, dict[str, tuple]] = {node.name: {} for node in nodes}
        for depth, level in enumerate(self.levels[:-1]):
            groups: dict[tuple, list[str]] = {}
            for node in nodes:
                key = tuple(node.labels[name] for name in self.levels[:depth + 1])
                groups.setdefault(key, []).append(node.name)
                self.domain_of[node.name][level] = key
            self.domains[level] = groups
        self.version: dict[tuple, int] = {}
        self.heaps: dict[ShapeKey, list] = {}
        self.cheapest: list | None = None  # (rank, node, sold) per node: the global heap
        self.whole = max((len(prices) for prices in self.prices.values()), default=0)
        # free GPUs per leaf (the level above the node), kept only for `gpu_room_micros`
        self.leaf_level = self.levels[-2] if gpu_room_micros and len(self.levels) > 1 else None
        self.room: dict[tuple, int] = {}
        if self.leaf_level is not None:
            for node in nodes:
                leaf = self.domain_of[node.name][self.leaf_level]
                self.room[leaf] = self.room.get(leaf, 0) + len(node.reserve_micros)

    # --- reading -----------------------------------------------------------------------

    def available(self, name: str) -> int:
        return max(0, len(self.prices[name]) - self.sold[name])

    def next_prices(self, name: str, count: int) -> tuple[int, ...]:
        start = self.sold[name]
        return self.prices[name][start:start + count]

    def _eligible(self, names: Iterable[str], runtimes: frozenset[str] | None) -> list[str]:
        if runtimes is None:
            return [name for name in names if self.available(name)]
        return [name for name in names if self.available(name) and self.runtime[name] in runtimes]

    def _members(self, level: str | None, domain: tuple) -> list[str]:
        if level is None:
            return list(self.prices)
        if level == self.node_level:
            return [domain[0]]
        return self.domains[level][domain]

    def _domain_keys(self, level: str | None) -> list[tuple]:
        if level is None:
            return [()]
        if level == self.node_level:
            return [(name,) for name in self.prices]
        return list(self.domains[level])

    def _version(self, level: str | None, domain: tuple) -> int:
        return self.version.get((level, domain), 0)

    def evaluate(self, key: ShapeKey, domain: tuple,
                 limit: int | None = None) -> tuple[int, int, int, Plan] | None:
        """(cost, dearest reserve taken, GPUs left in the domain, plan): the cheapest way to
        put the shape in this domain, ignoring its limit (or, given `limit`, using only the
        GPUs at or below it); None when it does not fit."""
        if limit is not None:
            return self._within(limit, lambda: self.evaluate(key, domain))
        names = self._eligible(self._members(key.level, domain), key.runtimes)
        total = sum(self.available(name) for name in names)
        if total < key.gpus:
            return None
        chunks: list[tuple[int, int, tuple[tuple[str, int], ...]]] = []
        if key.slice_size == 1:
            if len(names) == 1:
                name = names[0]
                taken = self.next_prices(name, key.gpus)
                return sum(taken), taken[-1], total - key.gpus, {name: key.gpus}
            # by rank: a node still whole is broken last (`_rank`)
            ranked = sorted((self._rank(name, self.sold[name] + at), price, name)
                            for name in names for at, price in
                            enumerate(self.next_prices(name, self.available(name))))[:key.gpus]
            plan: Plan = {}
            for _, _, name in ranked:
                plan[name] = plan.get(name, 0) + 1
            return (sum(rank for rank, _, _ in ranked), max(price for _, price, _ in ranked),
                    total - key.gpus, plan)
        size = key.slice_size
        if key.slice_level == self.node_level:
            for name in names:
                prices = self.next_prices(name, self.available(name))
                for start in range(0, len(prices) - size + 1, size):
                    chunk = prices[start:start + size]
                    chunks.append((sum(chunk), chunk[-1], ((name, size),)))
        else:
            units: dict[tuple, list[str]] = {}
            for name in names:
                units.setdefault(self.domain_of[name][key.slice_level], []).append(name)
            for members in units.values():
                gpus = sorted((price, name) for name in members
                              for price in self.next_prices(name, self.available(name)))
                for start in range(0, len(gpus) - size + 1, size):
                    chunk = gpus[start:start + size]
                    counts: dict[str, int] = {}
                    for _, name in chunk:
                        counts[name] = counts.get(name, 0) + 1
                    chunks.append((sum(p for p, _ in chunk), chunk[-1][0],
                                   tuple(counts.items())))
        wanted = key.gpus // size
        if len(chunks) < wanted:
            return None
        if self.room_micros and key.slice_level == self.node_level:
            chunks = self._by_room(key.level, names, chunks)
        chosen = heapq.nsmallest(wanted, chunks)
        plan = {}
        for _, _, parts in chosen:
            for name, count in parts:
                plan[name] = plan.get(name, 0) + count
        # a node's GPUs are sold cheapest first, so the plan's cost is what the sale takes
        cost = sum(sum(self.next_prices(name, count)) for name, count in plan.items())
        dearest = max(self.next_prices(name, count)[-1] for name, count in plan.items())
        return cost, dearest, total - key.gpus, plan

    def _by_room(self, level: str | None, names: Sequence[str], chunks: list) -> list:
        """Whole-node chunks of a bid required at `level`, each ranked `room_micros` dearer
        per free GPU of its domain one level below (`ROOM_MICROS`)."""
        if level is None or level == self.node_level:
            return chunks
        below = self.levels[self.levels.index(level) + 1]
        if below == self.node_level:
            return chunks
        room: dict[tuple, int] = {}
        for name in names:
            domain = self.domain_of[name][below]
            room[domain] = room.get(domain, 0) + self.available(name)
        return [(self.room_micros * room[self.domain_of[parts[0][0]][below]] + cost, dearest,
                 parts) for cost, dearest, parts in chunks]

    def _within(self, limit: int, compute):
        """`compute()` with every GPU priced above `limit` hidden (as if sold)."""
        saved = dict(self.prices)
        try:
            for name, prices in saved.items():
                cut = bisect.bisect_right(prices, limit)
                if cut < len(prices):
                    self.prices[name] = prices[:cut]
            return compute()
        finally:
            self.prices = saved

    def sorted_prices(self, level: str | None,
                      runtimes: frozenset[str] | None) -> list[list[int]]:
        """The unsold reserves of each domain of `level`, sorted, on nodes that can run
        `runtimes`."""
        result = []
        for domain in self._domain_keys(level):
            names = self._eligible(self._members(level, domain), runtimes)
            result.append(sorted(price for name in names
                                 for price in self.next_prices(name, self.available(name))))
        return result

    def fits(self, key: ShapeKey, limit: int) -> bool:
        """Exactly whether the shape fits in some domain using GPUs at or below `limit`
        (slow: every domain is looked at; nothing is cached)."""
        if key.level == self.node_level:
            return any(
                bisect.bisect_right(prices, limit) - self.sold[name] >= key.gpus
                and (key.runtimes is None or self.runtime[name] in key.runtimes)
                for name, prices in self.prices.items())
        return self._within(limit, lambda: any(
            self.evaluate(key, domain) is not None for domain in self._domain_keys(key.level)))

    # --- placing -----------------------------------------------------------------------

    def place(self, shape: Bid, key: ShapeKey) -> Plan | None:
        """The cheapest placement of the shape within its limit; changes nothing."""
        if key.level is None and key.slice_size == 1:
            return self._cheapest_anywhere(key, shape.limit_micros)
        heap = self.heaps.get(key)
        if heap is None:
            heap = []
            for domain in self._domain_keys(key.level):
                found = self.evaluate(key, domain)
                if found is not None:
                    cost, dearest, left, plan = found
                    heap.append((cost + LEFT_OVER_MICROS * left, left, domain,
                                 self._version(key.level, domain), dearest, plan))
            heapq.heapify(heap)
            self.heaps[key] = heap
        aside = []
        found_plan = None
        while heap and len(aside) < LOOK_PAST:
            rank, left, domain, version, dearest, plan = heap[0]
            if version != self._version(key.level, domain):
                heapq.heappop(heap)
                fresh = self.evaluate(key, domain)
                if fresh is not None:
                    cost, dearest, left, plan = fresh
                    heapq.heappush(heap, (cost + LEFT_OVER_MICROS * left, left, domain,
                                          self._version(key.level, domain),
                                          dearest, plan))
                continue
            if dearest <= shape.limit_micros:
                found_plan = plan
                break
            aside.append(heapq.heappop(heap))
        for entry in aside:
            heapq.heappush(heap, entry)
        return None if found_plan is None else dict(found_plan)

    def _rank(self, name: str, index: int) -> int:
        """What a bid free to go anywhere counts for a node's GPU `index`: its reserve, plus
        `whole_node_micros` (`WHOLE_NODE_MICROS`) for the first GPU of a node still whole (one
        of the market's largest, nothing sold), which bids needing whole nodes may want, and
        `gpu_room_micros` per free GPU of its leaf (`GPU_ROOM_MICROS`)."""
        price = self.prices[name][index]
        if self.leaf_level is not None:
            price += self.gpu_room_micros * self.room[self.domain_of[name][self.leaf_level]]
        if index == 0 and len(self.prices[name]) == self.whole:
            return price + self.whole_node_micros
        return price

    def _cheapest_anywhere(self, key: ShapeKey, limit: int) -> Plan | None:
        """The market's cheapest GPUs (by `_rank`), wherever they are, from one heap of each
        node's cheapest unsold GPU (one valid entry per node: its rank at its current `sold`)."""
        if self.cheapest is None:
            self.cheapest = [(self._rank(name, 0), name, 0) for name in self.prices
                             if self.prices[name]]
            heapq.heapify(self.cheapest)
        heap = self.cheapest
        local: list[tuple[int, str, int]] = []
        plan: Plan = {}
        touched: list[str] = []
        aside = []
        got = 0
        while got < key.gpus:
            while heap and (heap[0][2] != self.sold[heap[0][1]]
                            or (key.runtimes is not None
                                and self.runtime[heap[0][1]] not in key.runtimes)):
                entry = heapq.heappop(heap)
                if entry[2] == self.sold[entry[1]]:
                    aside.append(entry)  # valid, but this bid may not use the node
            if heap and (not local or heap[0] < local[0]):
                rank, name, index = heapq.heappop(heap)
                touched.append(name)
            elif local:
                rank, name, index = heapq.heappop(local)
            else:
                break
            if rank > limit + self.whole_node_micros:
                break  # every GPU left is dearer than the limit
            if self.prices[name][index] > limit:
                continue  # too dear, and so are the node's next GPUs
            plan[name] = plan.get(name, 0) + 1
            got += 1
            if index + 1 < len(self.prices[name]):
                heapq.heappush(local, (self._rank(name, index + 1), name, index + 1))
        # put back what was looked at: the sale, if any, pushes fresh entries itself
        for name in touched:
            if self.available(name):
                heapq.heappush(heap, (self._rank(name, self.sold[name]), name, self.sold[name]))
        for entry in aside:
            heapq.heappush(heap, entry)
        return plan if got == key.gpus else None

    def sell(self, plan: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Take the plan's GPUs, cheapest first on each node; the reserves taken."""
        taken = {}
        for name, count in plan.items():
            if not count:
                continue
            taken[name] = self.next_prices(name, count)
            assert len(taken[name]) == count, "sold more GPUs than a node has"
            self.sold[name] += count
            if self.leaf_level is not None:
                self.room[self.domain_of[name][self.leaf_level]] -= count
            for level, domain in self.domain_of[name].items():
                self.version[(level, domain)] = self._version(level, domain) + 1
            self.version[(self.node_level, (name,))] = self._version(self.node_level,
                                                                     (name,)) + 1
            self.version[(None, ())] = self._version(None, ()) + 1
            if self.cheapest is not None and self.available(name):
                heapq.heappush(self.cheapest, (self._rank(name, self.sold[name]), name,
                                               self.sold[name]))
        return taken


@dataclass(frozen=True)
class Sale:
    option: int  # index into the options
    assignment: dict[str, int]
    reserves_micros: dict[str, tuple[int, ...]]


def greedy(
    levels: Sequence[str],
    nodes_by_market: Mapping[str, Sequence[NodeOffer]],
    options: Sequence[Option],
    order: Sequence[int],
    stop: Callable[[], bool] = lambda: False,
    whole_node_micros: int = WHOLE_NODE_MICROS,
    room_micros: int = 0,
    gpu_room_micros: int = 0,
) -> list[Sale]:
    """Place options in `order`, each where it costs least, at most one option per order.
    A shape refused once is refused again, without a search, for any later option of the
    same constraint with at least as many GPUs and a limit no higher (capacity only shrinks).
    `stop()` true: the options left are not tried. `whole_node_micros`: what breaking a node
    still whole counts for a bid that could go elsewhere (`MarketStock._rank`); `room_micros`:
    what a whole node's leaf room counts for a bid of whole-node slices (`ROOM_MICROS`);
    `gpu_room_micros`: what it counts per GPU for the others (`GPU_ROOM_MICROS`)."""
    stocks = {market: MarketStock(levels, nodes, whole_node_micros, room_micros,
                                  gpu_room_micros)
              for market, nodes in nodes_by_market.items()}
    won: set[int] = set()
    sales: list[Sale] = []
    refused: dict[tuple, list[tuple[int, int]]] = {}
    for count, index in enumerate(order):
        if count % 64 == 0 and stop():
            break
        option = options[index]
        if option.order in won or option.market not in stocks:
            continue
        key = shape_key(option.shape, levels)
        family = (option.market, key.level, key.slice_size, key.slice_level, key.runtimes)
        limit = option.shape.limit_micros
        if any(key.gpus >= gpus and limit <= cap for gpus, cap in refused.get(family, ())):
            continue
        stock = stocks[option.market]
        plan = stock.place(option.shape, key)
        if plan is None:
            refused.setdefault(family, []).append((key.gpus, limit))
            continue
        won.add(option.order)
        sales.append(Sale(index, plan, stock.sell(plan)))
    return sales


def lowest_fitting_limits(levels: Sequence[str], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
                          options: Sequence[Option]) -> list[int | None]:
    """For each option, the lowest limit among its family's (market and shape) at which it
    fits in its market with nothing else sold (None: none does). Fitting only gets easier as
    the limit rises, so one binary search per family, not a search per bid."""
    stocks = {market: MarketStock(levels, nodes) for market, nodes in nodes_by_market.items()}
    families: dict[tuple, list[int]] = {}
    for i, option in enumerate(options):
        families.setdefault((option.market, shape_key(option.shape, levels)), []).append(i)
    lowest: list[int | None] = [None] * len(options)
    prices_in: dict[tuple, list[list[int]]] = {}
    for (market, key), members in families.items():
        limits = sorted({options[i].shape.limit_micros for i in members})
        stock = stocks[market]
        if key.slice_size == 1:  # fits at a limit iff some domain has `gpus` GPUs at or below it
            where = (market, key.level, key.runtimes)
            if where not in prices_in:
                prices_in[where] = stock.sorted_prices(key.level, key.runtimes)
            least = min((prices[key.gpus - 1] for prices in prices_in[where]
                         if len(prices) >= key.gpus), default=None)
            at = len(limits) if least is None else bisect.bisect_left(limits, least)
            for i in members:
                lowest[i] = limits[at] if at < len(limits) else None
            continue
        low, high = 0, len(limits)
        while low < high:
            middle = (low + high) // 2
            if stock.fits(key, limits[middle]):
                high = middle
            else:
                low = middle + 1
        for i in members:
            lowest[i] = limits[low] if low < len(limits) else None
    return lowest


def domains_holding(levels: Sequence[str], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
                    options: Sequence[Option], indices: Iterable[int]) -> dict[int, int]:
    """For each of the options `indices`, how many domains of its required level (the market
    when none) could hold it with nothing sold, at any price: how scarce its room is."""
    stocks: dict[str, MarketStock] = {}
    free: dict[tuple, list[int]] = {}  # (market, level) -> each domain's free GPUs
    holding: dict[tuple, int] = {}
    result = {}
    for i in indices:
        option = options[i]
        key = shape_key(option.shape, levels)
        family = (option.market, key)
        if family not in holding:
            if option.market not in stocks:
                stocks[option.market] = MarketStock(levels, nodes_by_market[option.market])
            stock = stocks[option.market]
            domains = stock._domain_keys(key.level)
            if key.slice_size == 1 and key.runtimes is None:  # any of its free GPUs will do
                where = (option.market, key.level)
                if where not in free:
                    free[where] = [sum(stock.available(name)
                                       for name in stock._members(key.level, domain))
                                   for domain in domains]
                holding[family] = sum(gpus >= key.gpus for gpus in free[where])
            else:
                holding[family] = sum(stock.evaluate(key, domain) is not None
                                      for domain in domains)
        result[i] = holding[family]
    return result


def fits_at_any_price(stock: MarketStock, shape: Bid, levels: Sequence[str]) -> bool:
    return stock.fits(shape_key(shape, levels), max(
        (prices[-1] for prices in stock.prices.values() if prices), default=0))



def movable(shape: Bid, levels: Sequence[str], level: str | None) -> bool:
    """Whether the shape may take any GPU (at or below its limit) within one domain of `level`
    (None: the market) in place of those it has there: nothing ties its GPUs to nodes (no
    slices, any runtime) and its required level, if any, is that level or above it. Within
    one node every bid may, the count on the node staying the same."""
    if level == levels[-1]:
        return True
    topology = shape.topology
    if (topology.slice_size or 1) > 1 or shape.runtimes is not None:
        return False
    if topology.required is None:
        return True
    return level is not None and levels.index(topology.required) <= levels.index(level)


def redeal(levels: Sequence[str], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
           options: Sequence[Option], sales: Sequence[Sale]) -> list[Sale]:
    """The same winners, their GPUs dealt again so that the longest bids pay the lowest
    reserves: welfare is the sum of hours x (limit - reserve), so the same GPUs sold to the same
    bids are worth most when the cheap ones go to the bids of most hours (the greedy, placing
    in value order, does not see that).

    First whole placements change hands between winners of one shape (`_swap_placements`),
    and what two nodes with as many free GPUs sold changes nodes (`_swap_nodes`), then pool
    by pool: the market (the bids free to take any GPU), then each domain of each
    level down to the node (the GPUs there of the bids `movable` within it, each bid keeping its
    count there). Within a pool the deal is exact: the dearest GPU goes to the bid of fewest
    hours among those that may take it (limit at or above its reserve) and still want GPUs,
    then the next dearest, and so on. Exchanging GPUs between two bids proves it no worse than
    any other deal, and it never strands a bid: whoever may take a GPU may take every cheaper
    one. Every constraint holds as before, so each pool only adds welfare."""
    domain_of = {node.name: [tuple(node.labels[name] for name in levels[:depth + 1])
                             for depth in range(len(levels) - 1)] + [(node.name,)]
                 for nodes in nodes_by_market.values() for node in nodes}
    held = [{name: list(prices) for name, prices in sale.reserves_micros.items()}
            for sale in sales]
    _swap_placements(levels, options, sales, held)
    _swap_nodes(levels, nodes_by_market, options, sales, held)
    for depth, level in [(-1, None), *enumerate(levels)]:
        pools: dict[tuple, dict[int, list[tuple[int, str]]]] = {}
        for position, sale in enumerate(sales):
            option = options[sale.option]
            if not movable(option.shape, levels, level):
                continue
            for name, prices in held[position].items():
                if not prices:
                    continue
                key = (option.market, () if level is None else domain_of[name][depth])
                pools.setdefault(key, {}).setdefault(position, []).extend(
                    (price, name) for price in prices)
        for parts in pools.values():
            if len(parts) > 1:
                _deal(options, sales, held, list(parts.items()))
    result = []
    for sale, plan in zip(sales, held, strict=True):
        reserves = {name: tuple(sorted(prices)) for name, prices in plan.items() if prices}
        result.append(Sale(sale.option, {name: len(p) for name, p in reserves.items()},
                           reserves))
    return result


def _swap_placements(levels, options, sales, held) -> None:
    """Whole placements exchanged between the winners of one shape in one market (a placement
    of one is a placement of the other), updating `held` in place: by hours, most first, each
    bid takes the cheapest placement left that it may take (its limit at or above every
    reserve there). The pools of `redeal` deal GPUs within one domain; this moves a long bid
    to a cheaper leaf or spine that a shorter bid of its shape holds (+$8.6k on the
    benchmark's 10,000 bids, most of it spine and leaf bids). A shape is dealt again only
    where every bid gets a placement and the hours x reserves paid fall."""
    by_shape: dict[tuple, list[int]] = {}
    for position, sale in enumerate(sales):
        option = options[sale.option]
        by_shape.setdefault((option.market, shape_key(option.shape, levels)), []).append(
            position)
    for positions in by_shape.values():
        if len(positions) < 2:
            continue
        plans = [held[position] for position in positions]
        cost = [sum(sum(prices) for prices in plan.values()) for plan in plans]
        dearest = [max((max(prices) for prices in plan.values() if prices), default=0)
                   for plan in plans]
        shapes = [options[sales[position].option].shape for position in positions]
        left = sorted(range(len(plans)), key=lambda j: cost[j])
        given: dict[int, int] = {}
        for i in sorted(range(len(plans)), key=lambda i: -shapes[i].hours):
            j = next((j for j in left if dearest[j] <= shapes[i].limit_micros), None)
            if j is None:
                break
            left.remove(j)
            given[i] = j
        if len(given) < len(plans):
            continue
        if (sum(shapes[i].hours * cost[j] for i, j in given.items())
                < sum(shape.hours * paid for shape, paid in zip(shapes, cost, strict=True))):
            for i, j in given.items():
                held[positions[i]] = plans[j]


def _swap_nodes(levels, nodes_by_market, options, sales, held) -> None:
    """What two nodes with as many free GPUs have sold changes nodes, updating `held` in
    place, where the bids of more GPU-hours get the cheaper node: a spine bid's whole-node
    slices and a `node` bid never leave their nodes in the pools of `redeal`, and the greedy
    seats them on nodes picked for room, not price (+$5.6k on the benchmark's 10,000 bids,
    $4.2k of it on whole nodes). Nodes are paired within one domain of the widest level, and
    only where every bid on either node may sit on the other (its required and slice domains,
    its runtimes and limit)."""
    content: dict[str, list[int]] = {}  # node -> the sales holding GPUs on it
    for position, plan in enumerate(held):
        for name, prices in plan.items():
            if prices:
                content.setdefault(name, []).append(position)
    inner = levels[1:-1]  # the levels a sale may be held within, below the widest
    bids = []  # per sale: (-hours, limit, the inner levels it must stay within, runtimes)
    for sale in sales:
        shape = options[sale.option].shape
        topology = shape.topology
        slice_level = ((topology.slice_level or levels[-1])
                       if (topology.slice_size or 1) > 1 else None)
        bids.append((-float(shape.hours), shape.limit_micros,
                     [level in (topology.required, slice_level) for level in inner],
                     shape.runtimes))
    widest = levels[0] if len(levels) > 1 else None
    for nodes in nodes_by_market.values():
        groups: dict[tuple, list[NodeOffer]] = {}
        for node in nodes:
            if node.reserve_micros:
                key = (node.labels[widest] if widest else "", node.free_gpus)
                groups.setdefault(key, []).append(node)
        for members in groups.values():
            if len(members) > 1 and any(node.name in content for node in members):
                _swap_within(levels, bids, held, content, members)


def _swap_within(levels, bids, held, content, members) -> None:
    """`_swap_nodes` for nodes of one domain and one count of free GPUs: the exchange of two
    nodes' sales that saves most (hours x reserves) made, until none saves anything. Within a
    node the longest bids take the cheapest GPUs."""
    import numpy as np

    count, size = len(members), members[0].free_gpus
    reserves = np.array([node.reserve_micros for node in members], dtype=np.float64)
    if (reserves == reserves[0]).all():
        return
    inner = levels[1:-1]
    index: dict[tuple, int] = {}
    here = np.array([[index.setdefault(tuple(node.labels[name] for name in levels[:depth + 2]),
                                       len(index))
                      for depth in range(len(inner))] for node in members],
                    dtype=np.int64).reshape(count, len(inner))
    need = [[False] * len(inner) for _ in members]  # its sales must stay in its domain
    hours = [[0.0] * size for _ in members]
    limits = [[math.inf] * size for _ in members]
    runtimes: list[frozenset[str] | None] = [None] * count
    gpus_of = []  # per node: (-hours, limit, sale) of each GPU sold there, longest first
    for i, node in enumerate(members):
        gpus = []
        for position in content.get(node.name, ()):
            minus_hours, limit, stays, allowed_runtimes = bids[position]
            if any(stays):
                need[i] = [a or b for a, b in zip(need[i], stays, strict=True)]
            if allowed_runtimes is not None:
                runtimes[i] = (allowed_runtimes if runtimes[i] is None
                               else runtimes[i] & allowed_runtimes)
            gpus.extend([(minus_hours, limit, position)] * len(held[position][node.name]))
        gpus.sort()
        gpus_of.append(gpus)
        for at, (minus_hours, limit, _) in enumerate(gpus):
            hours[i][at] = -minus_hours
            limits[i][at] = limit
    need, hours, limits = (np.array(need, dtype=bool).reshape(count, len(inner)),
                           np.array(hours), np.array(limits))
    # may node i's sales sit on node j
    allowed = ((~need[:, None, :]) | (here[:, None, :] == here[None, :, :])).all(axis=2)
    for i, allowed_runtimes in enumerate(runtimes):
        if allowed_runtimes is not None:
            allowed[i] &= [node.runtime in allowed_runtimes for node in members]
    allowed &= (limits[:, None, :] >= reserves[None, :, :]).all(axis=2)
    owner = list(range(count))  # whose sales each node now holds
    for _ in range(count * count):
        cost = hours @ reserves.T  # [i, j]: node i's sales on node j, hours x reserves
        own = np.diag(cost)
        saved = np.triu(own[:, None] + own[None, :] - cost - cost.T)
        saved[~(allowed & allowed.T)] = 0.0
        pairs = np.argwhere(saved >= 1.0)  # a micro-dollar or more saved
        if not len(pairs):
            break
        # the exchanges that save most, of nodes not yet exchanged: each saving stands alone
        swapped: set[int] = set()
        for a, b in pairs[np.argsort(-saved[pairs[:, 0], pairs[:, 1]], kind="stable")]:
            if a in swapped or b in swapped:
                continue
            swapped.update((a, b))
            for table in (hours, limits, allowed):
                table[[a, b]] = table[[b, a]]
            owner[a], owner[b] = owner[b], owner[a]
    if owner == list(range(count)):
        return
    for node in members:
        for position in content.get(node.name, ()):
            held[position].pop(node.name, None)
    for j, node in enumerate(members):
        gpus = gpus_of[owner[j]]
        for (_, _, position), price in zip(gpus, node.reserve_micros, strict=False):
            held[position].setdefault(node.name, []).append(price)
        content[node.name] = list(dict.fromkeys(position for _, _, position in gpus))


def _deal(options, sales, held, parts) -> None:
    """Deal the parts' GPUs again (see `redeal`), updating `held` in place."""
    gpus = sorted((gpu for _, mine in parts for gpu in mine), reverse=True)
    shape_of = {position: options[sales[position].option].shape for position, _ in parts}
    left = {position: len(mine) for position, mine in parts}
    bidders = sorted(left, key=lambda position: -shape_of[position].limit_micros)
    wanting: list[tuple] = []  # (hours, position): the bids that may take the GPU at hand
    dealt: dict[int, list[tuple[int, str]]] = {position: [] for position in left}
    next_bidder = 0
    for price, name in gpus:
        while (next_bidder < len(bidders)
               and shape_of[bidders[next_bidder]].limit_micros >= price):
            position = bidders[next_bidder]
            heapq.heappush(wanting, (shape_of[position].hours, position))
            next_bidder += 1
        if not wanting:  # cannot happen: the current deal gave this GPU to one of them
            return
        _, position = wanting[0]
        dealt[position].append((price, name))
        left[position] -= 1
        if not left[position]:
            heapq.heappop(wanting)
    for position, mine in parts:
        plan = held[position]
        for price, name in mine:
            plan[name].remove(price)
        for price, name in dealt[position]:
            plan.setdefault(name, []).append(price)

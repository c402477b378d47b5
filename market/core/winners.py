"""Winner determination for the batch auction: the welfare-maximising clearing, its proven
bound, one uniform price per market, and a price to win for every refused bid.

Pure Python, no Django, no placement engine: this module places bids itself (reserve-aware,
`winners_search`) and solves with HiGHS (`winners_solver`). It sits beside the greedy
`clearing.clear_auction`, which it does not replace for on-demand matching.

    clear_welfare(levels, nodes, bids, time_limit_s=5.0, price_to_win=True) -> WelfareClearing
    AlternativeBid(id, alternatives=(Bid, ...), submitted_at=None)   2 to 8 shapes, one may win

**The problem.** Welfare = the sum over winners and each GPU they take of (the bid's limit -
the GPU's reserve) x the bid's hours. The clearing maximises it subject to everything a bid
says: all of its GPUs or none; its GPU model(s) (one market per model; a shape naming several
models, or none, may win in any of them); every GPU in one domain of its required level;
slices (each domain of the slice level holds a multiple of the slice size); only GPUs whose
reserve is at or below its limit, on nodes whose runtime can run it; each GPU sold once; at
most one alternative of a bid wins. `preferred` is a wish the optimisation ignores.

**How.** A reserve-aware greedy gives the first incumbent (`winners_search.greedy`), redealt
so that the longest winners hold the cheapest of the GPUs the winners share
(`winners_search.redeal`: whole placements between winners of one shape, what two nodes
sold between the nodes, then exact pool by pool, every constraint kept). A book
whose integer programme is small (`MIP_MAX_COLUMNS`) is then solved whole by HiGHS, started
from that incumbent, within the time budget: `welfare_bound` is the solver's dual bound, valid
even when the budget stops it. A bigger book is decomposed by Lagrangian relaxation
(`winners_solver.lagrangian_bound`): GPUs pooled in price tiers per market and node size,
the packing of bids that need a leaf or a spine held by per-size counts of what the domains
can hold, every coupling constraint priced by a multiplier improved by subgradient steps; any
multipliers give a valid bound. The leaf and spine bids the multipliers take (a gain beyond
the shadow prices) are then placed again by the greedy first, the rest after them in value
order, three ways (the picks with fewest domains that could hold them first, a spine pick
keeping the roomiest leaves whole; then the picks in value order, twice); redealt, the best
incumbent is kept. Then exchanges (`winners_exchange`)
put losing leaf and spine bids in place of small winners, which go elsewhere or lose, while
welfare rises.
`gap` = (bound - welfare) / bound is therefore certified: the optimum is at most `gap` above
the welfare sold. `optimal` is true only when HiGHS proved the optimum.

**Price (per GPU-hour, one per market).** P = the highest of (a) the highest reserve of any
GPU sold and (b) the highest limit among the refused shapes of this market whose limit is at
or below every winner's limit. Each winner pays min(P, its limit). Properties:
- no winner pays above its limit, and no GPU sells below its reserve (a winner pays P, at or
  above every reserve sold, or its own limit, at or above its GPUs' reserves);
- the price is uniform: every winner pays the same P, except where a dear GPU sold to one
  winner lifted P above another winner's limit; that winner then pays its limit;
- why not lower: below P, either a sold GPU would go below its reserve, or a refused bidder
  offered more per GPU-hour than the winners would pay while every winner bid at least as
  much as it;
- which losers could have paid it: a refused bid with a limit above P lost on welfare, not
  on price (fewer hours, a topology no domain could hold beside the winners, dearer GPUs);
  its `price_to_win` says what it would have taken.

**Price to win.** For a refused bid: the lowest limit, in whole cents, at which it would have
won this clearing with nothing else changed. Exact for books solved by the integer programme:
with the bid forced in (every GPU open to it), the best welfare of the rest C fixes the
smallest cent P (at or above the dearest GPU that answer takes) with hours x gpus x P + C >
the optimum; then the GPUs open to it are capped a cent below P and the solve repeats until
no lower price wins. For bigger books it is an estimate from the
relaxation's shadow prices (the cheapest tier the bid may use plus that tier's shadow price
per hour), a lower bound in the relaxed market; `price_to_win_reason` says which. None, with
the reason, when the bid fits nowhere in the market at any price. For a bid of alternatives
it is the alternative that needs the smallest raise (`price_to_win_alternative`).

Money: micro-dollars and Decimal outside the solvers; floats only inside HiGHS and the
Lagrangian bound (rounded up to the micro-dollar, with a margin for float error), every
clearing re-priced exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal

from billing.core.money import MICROS_PER_DOLLAR, ROUNDING, to_dollars
from market.core.clearing import (
    ONE_MICRO,
    Bid,
    NodeOffer,
    auction_order,
    check_topology,
    dollars,
)
from market.core.whatif import InvalidInput
from market.core.winners_exchange import exchanges
from market.core.winners_search import (
    GPU_ROOM_MICROS,
    ROOM_MICROS,
    WHOLE_NODE_MICROS,
    WHOLE_NODE_WIDE_MICROS,
    MarketStock,
    Option,
    Sale,
    domains_holding,
    fits_at_any_price,
    greedy,
    lowest_fitting_limits,
    redeal,
    shape_key,
)
from market.core.winners_solver import (
    Shadow,
    lagrangian_bound,
    mip_size,
    node_need,
    solve_mip,
)
from pool.core.workloads import why_runtimes

DEFAULT_TIME_LIMIT_S = 5.0
MIP_MAX_COLUMNS = 20_000  # `take` columns: above this the book is solved by decomposition
BOUND_SHARE = 0.8  # of the budget, for the bound of a decomposed book; the rest for incumbents
EXCHANGE_SHARE = 0.1  # of the budget, left to the exchanges after the bound
MIN_BOUND_SHARE = 0.3  # of the time left after the first incumbent, for the bound at least
# a bid the relaxation's multipliers leave within a cent a GPU of zero gain is a pick too:
# only near their optimum, they leave the marginal bids near zero, on either side (a 256-GPU
# spine bid at -$0.00 was the optimum's, against a 128-GPU one at +$30: +1.7 % on a
# two-spine slice, +$1.4k on a 2,500-node book; 10 cents lost $180 on a 1,000-node one)
PICK_TOLERANCE = 0.01  # dollars per GPU
# the seating pass's losing picks (by gain) each tried again seated first, while the budget
# holds a pass: the scarcest pick can break every domain of a later one (a one-spine book of
# 256 nodes: its 256-GPU spine bid, held by one spine, took 32 of its 36 whole nodes from
# every leaf that held a 48-GPU leaf pick $2k better; seated first, the leaf pick broke only
# two, and the welfare rose 9.6 %, above HiGHS's in 20 s). At full scale the time rule
# below skips them
PROMOTED_TRIED = 8
MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 8
CENT = 10_000  # micro-dollars


@dataclass(frozen=True)
class AlternativeBid:
    """A bid over 2 to 8 shapes (each a `Bid` with its own gpus, models, topology, hours and
    limit, named by this bid's id); at most one of them wins."""

    id: str
    alternatives: tuple[Bid, ...]
    submitted_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "alternatives", tuple(self.alternatives))
        count = len(self.alternatives)
        if not MIN_ALTERNATIVES <= count <= MAX_ALTERNATIVES:
            raise InvalidInput(f"bid {self.id}.alternatives",
                               f"give {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} alternatives, "
                               f"not {count}")
        for i, shape in enumerate(self.alternatives):
            if not shape.gpu_models:
                raise InvalidInput(f"bid {self.id}.alternatives[{i}].gpu_models",
                                   "names no market: give the GPU model(s) it may use")


Order = Bid | AlternativeBid


def shapes_of(order: Order) -> tuple[Bid, ...]:
    return order.alternatives if isinstance(order, AlternativeBid) else (order,)


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Winner:
    bid: Order
    alternative: int  # index of the shape that won (0 for a bid of one shape)
    shape: Bid
    assignment: Mapping[str, int]  # node -> GPUs
    reserves_micros: Mapping[str, tuple[int, ...]]  # node -> reserve of each GPU taken
    price_micros: int  # per GPU-hour

    @property
    def welfare(self) -> Decimal:
        return dollars(_surplus(self.shape, self.reserves_micros))

    @property
    def total(self) -> Decimal:
        return dollars(self.price_micros * self.shape.gpus * self.shape.hours)


@dataclass(frozen=True)
class Loser:
    bid: Order
    reason: str
    price_to_win_micros: int | None = None  # whole cents; None: see price_to_win_reason
    price_to_win_reason: str = ""
    price_to_win_alternative: int = 0


@dataclass(frozen=True)
class MarketResult:
    gpu_model: str
    clearing_price_micros: int | None  # None: nothing sold and nothing refused
    welfare: Decimal
    welfare_bound: Decimal  # an upper bound on the optimum
    gap: Decimal  # (welfare_bound - welfare) / welfare_bound, 0 when the bound is 0
    optimal: bool
    accepted: tuple[Winner, ...]
    refused: tuple[Loser, ...]
    method: str  # "integer programme" or "greedy + relaxation bound"

    @property
    def gpus_sold(self) -> int:
        return sum(winner.shape.gpus for winner in self.accepted)


@dataclass(frozen=True)
class WelfareClearing:
    markets: tuple[MarketResult, ...]  # by GPU model
    refused: tuple[Loser, ...]  # bids that entered no market
    welfare: Decimal
    welfare_bound: Decimal
    gap: Decimal
    optimal: bool
    seconds: float  # the clearing, price_to_win excluded
    price_to_win_seconds: float

    def market(self, gpu_model: str) -> MarketResult:
        return next(market for market in self.markets if market.gpu_model == gpu_model)

    def winner(self, bid_id: str) -> Winner | None:
        return next((w for m in self.markets for w in m.accepted if w.bid.id == bid_id), None)

    def loser(self, bid_id: str) -> Loser | None:
        losers = [*self.refused, *(loser for m in self.markets for loser in m.refused)]
        return next((loser for loser in losers if loser.bid.id == bid_id), None)


def _surplus(shape: Bid, reserves: Mapping[str, tuple[int, ...]]) -> Decimal:
    """Welfare in micro-dollars (exact)."""
    return sum((shape.limit_micros - price for prices in reserves.values() for price in prices),
               0) * shape.hours


def _gap(welfare: Decimal, bound: Decimal) -> Decimal:
    return ((bound - welfare) / bound).quantize(ONE_MICRO, ROUNDING) if bound > 0 else Decimal(0)


# --- the clearing --------------------------------------------------------------------------


def options_of(orders: Sequence[Order], models: Sequence[str]) -> list[Option]:
    options = []
    for index, order in enumerate(orders):
        for alternative, shape in enumerate(shapes_of(order)):
            wanted = sorted(shape.gpu_models) if shape.gpu_models else list(models)
            options.extend(Option(index, alternative, shape, model)
                           for model in wanted if model in models)
    return options


def value_order(options: Sequence[Option], nodes_by_market: Mapping[str, Sequence[NodeOffer]],
                by_total: bool = False) -> list[int]:
    """Options by estimated welfare per GPU (or per bid), against each market's median
    reserve; ties by the auction's order (limit, submission, id)."""
    median = {}
    for market, nodes in nodes_by_market.items():
        prices = sorted(price for node in nodes for price in node.reserve_micros)
        median[market] = prices[len(prices) // 2] if prices else 0

    def key(i: int) -> tuple:
        option = options[i]
        shape = option.shape
        per_gpu = shape.hours * (shape.limit_micros - median.get(option.market, 0))
        return (-(per_gpu * shape.gpus if by_total else per_gpu), auction_order(shape),
                option.alternative)

    return sorted(range(len(options)), key=key)


def clear_welfare(
    levels: Sequence[str],
    nodes: Sequence[NodeOffer],
    bids: Sequence[Order],
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    price_to_win: bool = True,
) -> WelfareClearing:
    """The welfare-maximising clearing of one interval's bids (see the module notes)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    levels = tuple(levels)
    for order in bids:
        for i, shape in enumerate(shapes_of(order)):
            where = f"bid {order.id}" + (f".alternatives[{i}]"
                                         if isinstance(order, AlternativeBid) else "")
            check_topology(shape.topology, levels, f"{where}.topology")
    models = sorted({node.gpu_model for node in nodes})
    nodes_by_market = {model: [node for node in nodes if node.gpu_model == model]
                       for model in models}
    options = options_of(bids, models)
    entered = {option.order for option in options}
    outside = tuple(Loser(order, _no_market(order, models), None,
                          "it names no GPU model offered in this clearing")
                    for index, order in enumerate(bids) if index not in entered)

    first_started = time.perf_counter()
    incumbent = greedy(levels, nodes_by_market, options, value_order(options, nodes_by_market))
    redeal_started = time.perf_counter()
    incumbent = redeal(levels, nodes_by_market, options, incumbent)
    redeal_s = time.perf_counter() - redeal_started
    one_pass = time.perf_counter() - first_started  # a greedy pass and its redeal
    best = (_welfare_of(options, incumbent), incumbent)
    size = mip_size(nodes_by_market, options, MIP_MAX_COLUMNS)
    shadow: dict[str, Shadow] = {}
    row_price: dict[int, float] = {}
    if size <= MIP_MAX_COLUMNS:
        method = "integer programme"
        answer = solve_mip(levels, nodes_by_market, options,
                           max(0.05, deadline - time.perf_counter()), start=incumbent)
        if answer.feasible and _welfare_of(options, answer.sales) >= best[0]:
            best = (_welfare_of(options, answer.sales), answer.sales)
        optimal = answer.optimal and answer.feasible
        bound_dollars = answer.bound
        if not math.isfinite(bound_dollars):  # stopped before the root relaxation
            usable = _fits_alone(levels, nodes_by_market, options)
            bound_dollars = lagrangian_bound(
                levels, nodes_by_market, options, usable,
                time.perf_counter() + max(0.2, 0.2 * time_limit_s),
                incumbent=float(dollars(best[0])))[0]
    else:
        method = "greedy + Lagrangian bound"
        optimal = False
        usable = _fits_alone(levels, nodes_by_market, options)
        # the bound until a greedy pass, the exchanges' time and two redeals' (theirs varies
        # with the load) are left, and at least a share of the time left
        now = time.perf_counter()
        bound_until = max(now + MIN_BOUND_SHARE * (deadline - now),
                          min(started + BOUND_SHARE * time_limit_s,
                              deadline - one_pass - EXCHANGE_SHARE * time_limit_s
                              - 2 * redeal_s))
        bound_dollars, shadow, row_price, gains = lagrangian_bound(
            levels, nodes_by_market, options, usable, bound_until,
            incumbent=float(dollars(best[0])))
        in_value_order = value_order(options, nodes_by_market)
        # a second incumbent: the bids of a leaf or a spine that the relaxation takes
        # (positive gain beyond its prices) first, in value order, then the rest in value
        # order. The greedy alone lets small bids break up the domains those bids need;
        # all leaf and spine bids first is far worse ($1.50M against $1.72M on the
        # benchmark's 10,000 bids), the relaxation's picks of them first far better ($1.740M)
        node_level = levels[-1]
        picked = {i for i, gain in gains.items()
                  if gain > -PICK_TOLERANCE * options[i].shape.gpus
                  and options[i].shape.topology.required not in (None, node_level)}
        # three orders, the best kept: (1) the picks whose room is scarcest first (fewest
        # domains that could hold them: 64-GPU leaf bids fit 16 leaves of the benchmark's
        # 782, spine bids most of its 49 spines, 16-GPU leaf bids 764 leaves), then the
        # wider level, each in value order; each whole node a spine pick takes comes from the
        # leaves of least room (`ROOM_MICROS`), keeping the roomiest whole for the leaf picks
        # after it, and the bids taking GPUs one by one fill the tight leaves first
        # (`GPU_ROOM_MICROS`; in all three passes it lost 0.7 % on a one-spine slice); (2)
        # the picks in value order, whole nodes dearer to break (`WHOLE_NODE_WIDE_MICROS`), so
        # the leaf picks keep off the whole nodes the spine picks need; (3) the same at the
        # first pass's price. On the benchmark's 10,000 bids (1) is $20k better than (2):
        # seated before the spine picks, 15 of the 16 leaves that hold 64 GPUs get a 64-GPU
        # leaf bid (7 when the spine picks went first, their whole nodes spread over those
        # leaves: $12k less); (1) first, as the deadline cuts the last pass short
        scarcest = seating_order(levels, nodes_by_market, options, picked, in_value_order)
        rest = [i for i in in_value_order if i not in picked]
        in_turn = [i for i in in_value_order if i in picked] + rest
        first_won: set[int] = set()  # the orders the first pass seated

        def passes():
            """(order, whole node, room, GPU room) of each pass, each order built only when
            its pass is reached"""
            yield scarcest + rest, WHOLE_NODE_MICROS, ROOM_MICROS, GPU_ROOM_MICROS
            # the first pass again with each of its losing picks seated first
            losing = sorted((i for i in picked if options[i].order not in first_won),
                            key=lambda i: -gains[i])
            for i in losing[:PROMOTED_TRIED]:
                yield ([i] + [j for j in scarcest if j != i] + rest,
                       WHOLE_NODE_MICROS, ROOM_MICROS, GPU_ROOM_MICROS)
            yield in_turn, WHOLE_NODE_WIDE_MICROS, 0, 0
            yield in_turn, WHOLE_NODE_MICROS, 0, 0

        other: list[Sale] = []
        greedy_s = 0.0  # the first pass's time
        for at, (order, whole_node_micros, room_micros, gpu_room_micros) in enumerate(passes()):
            pass_started = time.perf_counter()
            if pass_started > deadline - 2 * redeal_s:
                break
            # a later pass only with time left for it, the redeal, the exchanges and the
            # redeal after them: on the benchmark's 10,000 bids the first pass is the best by
            # $20k, and a second redeal adds $1.3k (what a deal moved, nodes exchange again)
            if other and (pass_started + greedy_s + 3 * redeal_s
                          + EXCHANGE_SHARE * time_limit_s > deadline):
                break
            attempt = greedy(levels, nodes_by_market, options, order,
                             stop=lambda: time.perf_counter() > deadline - 2 * redeal_s,
                             whole_node_micros=whole_node_micros, room_micros=room_micros,
                             gpu_room_micros=gpu_room_micros)
            if at == 0:
                greedy_s = time.perf_counter() - pass_started
                first_won.update(options[sale.option].order for sale in attempt)
            if _welfare_of(options, attempt) > _welfare_of(options, other):
                other = attempt
        redeal_started = time.perf_counter()
        other = redeal(levels, nodes_by_market, options, other)
        redeal_s = time.perf_counter() - redeal_started
        if _welfare_of(options, other) > best[0]:
            best = (_welfare_of(options, other), other)
        one_pass = greedy_s + redeal_s  # one greedy pass and its redeal
        # exchanges: losing leaf and spine bids in place of small winners, which go elsewhere
        best = _exchanged(levels, nodes_by_market, options, best, in_value_order, deadline,
                          redeal_s)
        # a last pass, when the budget holds one: the best incumbent's winners placed
        # again longest first (the cheapest domains to the bids of most hours), then the rest;
        # on books of a few hundred bids it gained up to 1 %; on 10,000 it packs worse, and
        # the budget, which the bound has used most of, skips it
        if time.perf_counter() + 2 * one_pass < deadline:
            won = {sale.option for sale in best[1]}
            longest_first = sorted(won, key=lambda i: (-options[i].shape.hours,
                                                       -options[i].shape.gpus, i))
            other = redeal(levels, nodes_by_market, options, greedy(
                levels, nodes_by_market, options,
                longest_first + [i for i in in_value_order if i not in won],
                stop=lambda: time.perf_counter() > deadline - one_pass / 2))  # room to redeal
            if _welfare_of(options, other) > best[0]:
                best = (_welfare_of(options, other), other)
    welfare_micros, sales = best
    # a winner that adds no welfare (every GPU at its limit) is a tie, not a win: it loses,
    # as its price to win (the lowest limit that adds welfare) says
    sales = [sale for sale in sales if _surplus(options[sale.option].shape, sale.reserves_micros)]
    welfare = dollars(welfare_micros)
    # floats summed over thousands of terms: a relative margin keeps the bound an upper bound
    bound_dollars = bound_dollars * (1 + 1e-9) + 1e-6
    bound = max(welfare, Decimal(repr(bound_dollars)).quantize(ONE_MICRO, ROUND_CEILING))
    if optimal:
        bound = welfare  # proven: the solver's bound differs only by its float tolerance
    seconds = time.perf_counter() - started

    priced_from = time.perf_counter()
    markets = _markets(levels, bids, options, nodes_by_market, sales, welfare, bound, optimal,
                       method)
    if price_to_win:
        markets = _with_prices_to_win(levels, bids, options, nodes_by_market, markets, sales,
                                      welfare_micros, method, shadow, row_price,
                                      time_limit_s)
    return WelfareClearing(
        markets=markets, refused=outside, welfare=welfare, welfare_bound=bound,
        gap=_gap(welfare, bound), optimal=optimal, seconds=seconds,
        price_to_win_seconds=time.perf_counter() - priced_from,
    )


def seating_order(levels, nodes_by_market, options, picked, in_value_order) -> list[int]:
    """The relaxation's picks (options of a required level), scarcest room first: fewest
    domains that could hold them (`domains_holding`), then the wider level, each in
    `in_value_order`."""
    depth = {level: d for d, level in enumerate(levels)}
    holding = domains_holding(levels, nodes_by_market, options, picked)
    return sorted((i for i in in_value_order if i in picked),
                  key=lambda i: (holding[i], depth.get(options[i].shape.topology.required, 0)))


def _exchanged(levels, nodes_by_market, options, best, order, deadline: float,
               redeal_s: float) -> tuple[Decimal, list[Sale]]:
    """The best incumbent improved by exchanges (`winners_exchange`) while the budget holds
    them and a redeal after them (the last one took `redeal_s`); the better of the two. On
    the benchmark's 10,000 bids the exchanges add 0.2 % within half a second, and the redeal
    as much again: the winners they move sit on GPUs not yet dealt by hours."""
    until = deadline - 2 * redeal_s  # a redeal's time varies by a half with the load
    if time.perf_counter() >= until:
        return best
    exchanged = exchanges(levels, nodes_by_market, options, best[1], order,
                          stop=lambda: time.perf_counter() > until)
    if time.perf_counter() + 1.5 * redeal_s < deadline:
        exchanged = redeal(levels, nodes_by_market, options, exchanged)
    welfare = _welfare_of(options, exchanged)
    return (welfare, exchanged) if welfare > best[0] else best


def _welfare_of(options: Sequence[Option], sales: Sequence[Sale]) -> Decimal:
    return sum((_surplus(options[sale.option].shape, sale.reserves_micros) for sale in sales),
               Decimal(0))


def _no_market(order: Order, models: Sequence[str]) -> str:
    named = sorted({model for shape in shapes_of(order) for model in (shape.gpu_models or ())})
    if not models:
        return "no GPUs are offered in this clearing"
    return f"no {' or '.join(named)} GPUs offered"


def _fits_alone(levels, nodes_by_market, options) -> list[bool]:
    """Exactly whether each option fits in its market at its limit with nothing else sold."""
    lowest = lowest_fitting_limits(levels, nodes_by_market, options)
    return [low is not None and option.shape.limit_micros >= low
            for low, option in zip(lowest, options, strict=True)]


def _markets(levels, bids, options, nodes_by_market, sales, welfare, bound, optimal,
             method) -> tuple[MarketResult, ...]:
    won = {options[sale.option].order: sale for sale in sales}
    home: dict[int, str] = {}
    for option in options:  # a refused bid is listed in the market of its first option
        home.setdefault(option.order, option.market)
    slack = bound - welfare
    options_of_order: dict[int, list[Option]] = {}
    for option in options:
        options_of_order.setdefault(option.order, []).append(option)
    lowest_reserve = {market: min((p for node in nodes for p in node.reserve_micros),
                                  default=None)
                      for market, nodes in nodes_by_market.items()}
    markets = []
    for model in nodes_by_market:
        market_sales = [sale for sale in sales if options[sale.option].market == model]
        sold = [p for sale in market_sales for ps in sale.reserves_micros.values() for p in ps]
        winning_limits = [options[sale.option].shape.limit_micros for sale in market_sales]
        lowest_winning = min(winning_limits, default=None)
        refused_orders = [i for i, order in enumerate(bids) if i not in won
                          and home.get(i) == model]
        refused_limits = [option.shape.limit_micros for option in options
                          if option.market == model and option.order not in won]
        below = [limit for limit in refused_limits
                 if lowest_winning is None or limit <= lowest_winning]
        candidates = [value for value in (max(sold, default=None), max(below, default=None))
                      if value is not None]
        price = max(candidates) if candidates else None
        accepted = []
        for sale in sorted(market_sales, key=lambda s: options[s.option].order):
            option = options[sale.option]
            assert price is not None
            accepted.append(Winner(bids[option.order], option.alternative, option.shape,
                                   dict(sale.assignment), dict(sale.reserves_micros),
                                   min(price, option.shape.limit_micros)))
        refused = [Loser(bids[i], _why_refused(options_of_order.get(i, []), lowest_reserve))
                   for i in refused_orders]
        market_welfare = dollars(sum((_surplus(options[s.option].shape, s.reserves_micros)
                                      for s in market_sales), Decimal(0)))
        market_bound = market_welfare if optimal else market_welfare + slack
        markets.append(MarketResult(model, price, market_welfare, market_bound,
                                    _gap(market_welfare, market_bound), optimal,
                                    tuple(accepted), tuple(refused), method))
    return tuple(markets)


def _why_refused(mine: Sequence[Option], lowest_reserve: Mapping[str, int | None]) -> str:
    """A refused bid's reason (from its options): below every reserve it could take, or
    outbid."""
    below = []
    for option in mine:
        lowest = lowest_reserve[option.market]
        if lowest is None or option.shape.limit_micros >= lowest:
            return ("outbid: the welfare-maximising clearing gave the GPUs it could use to "
                    "bids worth more")
        below.append((option.shape.limit_micros, lowest, option.market))
    limit, lowest, market = min(below, key=lambda item: item[1] - item[0])
    return (f"the limit {to_dollars(limit)} is below the lowest reserve price in the {market} "
            f"market, {to_dollars(lowest)} per GPU-hour")


# --- price to win --------------------------------------------------------------------------


def _with_prices_to_win(levels, bids, options, nodes_by_market, markets, sales, optimum,
                        method, shadow, row_price, time_limit_s) -> tuple[MarketResult, ...]:
    fresh = {market: MarketStock(levels, nodes) for market, nodes in nodes_by_market.items()}
    fits_cache: dict[tuple, bool] = {}

    def fits_somewhere(option: Option) -> bool:
        family = (option.market, shape_key(option.shape, levels))
        if family not in fits_cache:
            fits_cache[family] = fits_at_any_price(fresh[option.market], option.shape, levels)
        return fits_cache[family]

    index_of = {id(order): index for index, order in enumerate(bids)}
    options_of_order: dict[int, list[int]] = {}
    for i, option in enumerate(options):
        options_of_order.setdefault(option.order, []).append(i)
    result = []
    for market in markets:
        losers = []
        for loser in market.refused:
            mine = options_of_order.get(index_of[id(loser.bid)], [])
            found: list[tuple[int, int, int, str]] = []  # (raise, price, alternative, how)
            reasons = []
            for i in mine:
                option = options[i]
                if not fits_somewhere(option):
                    reasons.append(_fits_nowhere(option, nodes_by_market[option.market]))
                    continue
                if method == "integer programme":
                    price, how = _exact_price_to_win(levels, nodes_by_market, options, sales,
                                                     optimum, i, time_limit_s)
                    if price is not None and not market.optimal:
                        how += ("; against the best clearing found, not a proven optimum: "
                                "an estimate")
                else:
                    price = _shadow_price_to_win(levels, option, shadow,
                                                 row_price.get(i, 0.0))
                    how = ("estimate from the Lagrangian bound's shadow prices (what the "
                           "relaxed market charges; the packing may ask more)")
                if price is None:
                    reasons.append(how)
                    continue
                found.append((price - option.shape.limit_micros, price, option.alternative,
                              how))
            if found:
                _, price, alternative, how = min(found)
                losers.append(Loser(loser.bid, loser.reason, price, how, alternative))
            else:
                reason = "; ".join(dict.fromkeys(reasons)) or "it entered no market"
                losers.append(Loser(loser.bid, reason
                                    if reasons and all("fits nowhere" in r for r in reasons)
                                    else loser.reason, None, reason))
        result.append(replace(market, refused=tuple(losers)))
    return tuple(result)


def _fits_nowhere(option: Option, nodes: Sequence[NodeOffer]) -> str:
    """Why no limit would win it: too few GPUs on nodes that can run it, too few in the
    market, or no domain of its required level (or slices) that holds it."""
    shape = option.shape
    free = sum(len(node.reserve_micros) for node in nodes)
    if shape.runtimes is not None:
        usable = sum(len(node.reserve_micros) for node in nodes
                     if node.runtime in shape.runtimes)
        if usable < shape.gpus <= free:
            return (f"fits nowhere at any price: only {usable} of {shape.gpus} GPUs are on "
                    f"nodes that can run it; {why_runtimes(shape.runtimes)}")
    if free < shape.gpus:
        return (f"fits nowhere at any price: the {option.market} market has {free} free "
                f"GPUs for {shape.gpus}")
    topology = shape.topology
    where = f"no {topology.required} domain" if topology.required else "no placement"
    sliced = (f" in slices of {topology.slice_size}" if topology.slice_size
              and topology.slice_size > 1 else "")
    runs = " on nodes that can run it" if shape.runtimes is not None else ""
    return (f"fits nowhere at any price: {where} of the {option.market} market holds "
            f"{shape.gpus} free GPUs{sliced}{runs}")


def _exact_price_to_win(levels, nodes_by_market, options, sales, optimum, index,
                        time_limit_s) -> tuple[int | None, str]:
    """The smallest whole-cent limit at which option `index` wins, by forced re-solves.

    With GPUs up to a cap X open to the bid, C(X) = the best welfare of the others minus the
    bid's reserves x hours, with the bid forced in; it only grows with X. A price P at or above
    the dearest GPU of that answer with hours x gpus x P + C(X) > the optimum wins; then the
    cap drops to a cent below P to see whether a lower price wins too, until none does."""
    option = options[index]
    shape = option.shape
    reserves = [p for node in nodes_by_market[option.market] for p in node.reserve_micros]
    cap = max(max(reserves, default=0), shape.limit_micros)
    units = shape.hours * shape.gpus
    floor = _next_cent(shape.limit_micros)
    best = None
    exact = True
    for attempt in range(16):
        answer = solve_mip(levels, nodes_by_market, options, time_limit_s, forced=index,
                           limits={index: cap})
        if not answer.feasible:
            break
        exact = exact and answer.optimal
        rest = Decimal(0)
        dearest = 0
        for sale in answer.sales:
            if sale.option == index:
                taken = [p for ps in sale.reserves_micros.values() for p in ps]
                rest -= sum(taken) * shape.hours
                dearest = max(taken)
            else:
                rest += _surplus(options[sale.option].shape, sale.reserves_micros)
        needed = (optimum - rest) / units  # the limit at which it ties the optimum
        cents = int((needed / CENT).to_integral_value(ROUND_FLOOR)) + 1
        price = max(cents * CENT, -(-dearest // CENT) * CENT, floor)
        if attempt and price > cap:  # the first cap opens every GPU: any price above works
            break
        best = price
        if price == floor:
            break
        cap = price - CENT
    if best is None:
        return None, "it fits nowhere beside the bids that must win"
    how = "exact: re-solved with the bid forced in"
    if not exact:
        how += " (a re-solve hit its time limit: an estimate)"
    return best, how


def _next_cent(micros: int) -> int:
    return (micros // CENT + 1) * CENT


def _shadow_price_to_win(levels, option: Option, shadow, row_price: float) -> int | None:
    """The cheapest usable tier's reserve plus its shadow price (and the bid's share of the
    row prices) per GPU-hour: below it the relaxation would not take the bid."""
    if option.market not in shadow:
        return None
    tiers = shadow[option.market]
    need = node_need(option, levels)
    shape = option.shape
    per_gpu_hour = float(MICROS_PER_DOLLAR) / (float(shape.hours) * shape.gpus)
    extra = row_price * per_gpu_hour
    candidates = [price + pi * float(MICROS_PER_DOLLAR) / float(shape.hours) + extra
                  for price, cls, pi in zip(tiers.prices, tiers.classes, tiers.pi, strict=True)
                  if cls >= need]
    if not candidates:
        return None
    return max(_next_cent(int(min(candidates))), _next_cent(shape.limit_micros))

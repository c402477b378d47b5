"""IBEX market clearing: frequent batch auctions and on-demand matching over plain data.

Pure Python, no Django, deterministic. The import arrows go `scheduler → market → pool`, so
this module never imports the placement engine: every function that needs to know where a
bid fits takes a `MakePlacer`, a factory of `Placer`s (place / commit / release over node
names). `scheduler.core.clearing_placer.IndexPlacer` plugs in the placement engine's
`PlacementIndex`; `python -m scheduler.clearing` runs one clearing on JSON.

    NodeOffer(name, labels, gpu_model, reserve_micros, runtime="none")   one node's free GPUs,
                                                          a price each, what its agent runs
    Topology(required=None, preferred=None, slice_size=None, slice_level=None)
    Bid(id, gpus, hours, limit_micros, gpu_models=None, topology=Topology(), submitted_at=None,
        runtimes=None)                                    runtimes: the node runtimes it may use
    SpotLease(id, limit_micros)

    clear_auction(levels, nodes, bids, make_placer, exact=True) -> AuctionClearing
    match_on_demand(levels, nodes, orders, make_placer) -> OnDemandResult
    solve_exact(levels, nodes, bids, time_limit_s=10.0) -> ExactSolution
    spot_leases_to_preempt(leases, clearing_price_micros) -> tuple[lease id, ...]
    micros("2.10") -> 2_100_000;  dollars(2_100_000) -> Decimal("2.10")

Auction rules, per market (one GPU model):
- bids are considered by descending limit, then earlier `submitted_at` (none: last), then id;
- a bid may only take GPUs whose reserve is at or below its limit, on nodes whose runtime
  can run what it asks (`runtimes`, from `pool.core.workloads.runtimes_for`; None: any node);
  it is accepted if the
  placer finds room for the whole bid (all or nothing, its topology constraint included) in
  the GPUs not yet sold; on a node it takes the cheapest such GPUs;
- the clearing price per GPU-hour is the highest limit among bids refused for lack of
  capacity, raised, where needed, to the highest reserve among the GPUs sold (when no bid
  was refused it is that reserve). Without the raise a high bidder's GPU could be sold below
  its reserve once a lower bid is refused: the raise keeps the price uniform *and* every GPU
  at or above its reserve;
- each winner pays min(clearing price, its own limit), so never more than it bid, and never
  less than the reserve of any GPU it got (its limit covers its GPUs' reserves);
- welfare = sum over winners and their GPUs of (limit - reserve) x hours.

Money: prices per GPU-hour are integer micro-dollars inside (`*_micros`), parsed from dollars
as everywhere in IBEX (`billing.core.money`); amounts that multiply by hours are `Decimal` dollars
rounded to the micro-dollar by IBEX's one rule (`billing.core.money.ROUNDING`, half to even).
Never floats, except inside the integer-program solver, whose answer is re-priced exactly.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Protocol

from billing.core.money import (
    MICROS_PER_DOLLAR,
    ROUNDING,
    BadAmount,
    parse_dollars,
    to_dollars,
)
from market.core.whatif import InvalidInput
from pool.core.workloads import why_runtimes

ONE_MICRO = Decimal("0.000001")
EXACT_MAX_BIDS = 60
EXACT_MAX_NODES = 200
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# --- money ---------------------------------------------------------------------------------


def micros(dollars_text: str, field: str = "price") -> int:
    """A price in dollars ("2.10") as integer micro-dollars, parsed as every amount in IBEX is
    (`billing.core.money.parse_dollars`: at most six decimals, nothing rounded away); prices are
    never negative."""
    try:
        amount = parse_dollars(dollars_text)
    except BadAmount as error:
        raise InvalidInput(field, str(error)) from None
    if amount < 0:
        raise InvalidInput(field, "must be a non-negative decimal")
    return amount


def dollars(amount_micros: int | Decimal) -> Decimal:
    """Micro-dollars as dollars, rounded half to even to the micro-dollar, at least 2 decimals."""
    value = (Decimal(amount_micros) / MICROS_PER_DOLLAR).quantize(ONE_MICRO, ROUNDING)
    cents = value.quantize(Decimal("0.01"))
    return cents if cents == value else value.normalize()


# --- plain data ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeOffer:
    """One node's free GPUs in a market, each with its provider's price per GPU-hour
    (the reserve in an auction, the posted price on demand). `labels` name the node's domain
    at every level but the last, as in the placement engine."""

    name: str
    labels: Mapping[str, str]
    gpu_model: str
    reserve_micros: tuple[int, ...]
    runtime: str = "none"  # what the node's agent runs (`pool.models.Node.Runtime`)

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("name", "must be a non-empty string")
        object.__setattr__(self, "reserve_micros", tuple(sorted(self.reserve_micros)))
        if any(price < 0 for price in self.reserve_micros):
            raise InvalidInput(f"{self.name}.reserve_prices", "must not be negative")

    @property
    def free_gpus(self) -> int:
        return len(self.reserve_micros)


@dataclass(frozen=True)
class Topology:
    """`required` / `preferred` name a level; a slice keeps GPUs in groups of `slice_size`
    inside one domain of `slice_level` (None: the node level, i.e. whole-node slices)."""

    required: str | None = None
    preferred: str | None = None
    slice_size: int | None = None
    slice_level: str | None = None


@dataclass(frozen=True)
class Bid:
    """An order: `gpus` GPUs for `hours`, at most `limit_micros` per GPU-hour."""

    id: str
    gpus: int
    hours: Decimal
    limit_micros: int
    gpu_models: frozenset[str] | None = None
    topology: Topology = Topology()
    submitted_at: datetime | None = None
    # the node runtimes that can run what it asks (a workload, SSH keys, a Slurm account or
    # none: `pool.core.workloads.runtimes_for`); None: any node
    runtimes: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InvalidInput(f"bid {self.id}.gpus", "must be at least 1")
        if not isinstance(self.hours, Decimal):
            object.__setattr__(self, "hours", Decimal(self.hours))
        if self.hours <= 0:
            raise InvalidInput(f"bid {self.id}.hours", "must be positive")
        if self.limit_micros < 0:
            raise InvalidInput(f"bid {self.id}.max_price_per_gpu_hour", "must not be negative")
        if self.gpu_models is not None and not isinstance(self.gpu_models, frozenset):
            object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))
        if self.runtimes is not None and not isinstance(self.runtimes, frozenset):
            object.__setattr__(self, "runtimes", frozenset(self.runtimes))
        if self.submitted_at is not None and self.submitted_at.tzinfo is None:
            object.__setattr__(self, "submitted_at", self.submitted_at.replace(tzinfo=UTC))
        size = self.topology.slice_size
        if size is not None and (size < 1 or self.gpus % size):
            raise InvalidInput(f"bid {self.id}.topology.slice.size",
                               "must be at least 1 and divide gpus")


@dataclass(frozen=True)
class SpotLease:
    id: str
    limit_micros: int


Assignment = Mapping[str, int]


class Placer(Protocol):
    """Where a whole bid fits in the GPUs a placer currently sees (node name -> GPUs)."""

    def place(self, bid: Bid) -> tuple[Assignment | None, str]:
        """The assignment, or None and the reason it does not fit; changes nothing."""

    def commit(self, assignment: Assignment) -> None:
        """Take these GPUs out of view (sold, or withheld by price)."""

    def release(self, assignment: Assignment) -> None:
        """Bring GPUs taken by `commit` back into view."""


# builds a placer over `levels` and nodes, each node showing all of its `free_gpus`
MakePlacer = Callable[[Sequence[str], Sequence[NodeOffer]], Placer]


# --- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedBid:
    bid: Bid
    assignment: Mapping[str, int]
    reserves_micros: Mapping[str, tuple[int, ...]]  # node -> reserve of each GPU taken
    price_micros: int  # per GPU-hour: min(clearing price, the bid's limit)

    @property
    def total(self) -> Decimal:
        return dollars(self.price_micros * self.bid.gpus * self.bid.hours)

    @property
    def welfare(self) -> Decimal:
        return _welfare(self.bid, self.reserves_micros)


@dataclass(frozen=True)
class RefusedBid:
    bid: Bid
    reason: str
    for_lack_of_capacity: bool = True  # False: the bid could not enter any market


@dataclass(frozen=True)
class ExactSolution:
    welfare: Decimal
    optimal: bool  # False: the time limit came first; `welfare` is the best found
    accepted_ids: tuple[str, ...]


@dataclass(frozen=True)
class ExactComparison:
    welfare: Decimal
    greedy_welfare: Decimal
    gap: Decimal  # (welfare - greedy_welfare) / welfare, 0 when welfare is 0
    optimal: bool


@dataclass(frozen=True)
class MarketClearing:
    gpu_model: str
    clearing_price_micros: int | None  # None: nothing sold and nothing refused
    accepted: tuple[AcceptedBid, ...]
    refused: tuple[RefusedBid, ...]
    exact: ExactComparison | None = None

    @property
    def gpus_sold(self) -> int:
        return sum(accepted.bid.gpus for accepted in self.accepted)

    @property
    def welfare(self) -> Decimal:
        return sum((accepted.welfare for accepted in self.accepted), Decimal(0))


@dataclass(frozen=True)
class AuctionClearing:
    markets: tuple[MarketClearing, ...]  # by GPU model
    refused: tuple[RefusedBid, ...] = ()  # bids that entered no market

    def market(self, gpu_model: str) -> MarketClearing:
        return next(market for market in self.markets if market.gpu_model == gpu_model)


@dataclass(frozen=True)
class PricedGpus:
    node: str
    price_micros: int
    gpus: int


@dataclass(frozen=True)
class OnDemandMatch:
    bid: Bid
    assignment: Mapping[str, int]
    lines: tuple[PricedGpus, ...]  # the posted prices paid, per node and price

    @property
    def cost_per_hour_micros(self) -> int:
        return sum(line.price_micros * line.gpus for line in self.lines)

    @property
    def total(self) -> Decimal:
        return dollars(self.cost_per_hour_micros * self.bid.hours)


@dataclass(frozen=True)
class OnDemandResult:
    matched: tuple[OnDemandMatch, ...]
    refused: tuple[RefusedBid, ...]


# --- the stock of unsold GPUs --------------------------------------------------------------


class Stock:
    """Unsold GPUs per node, kept in step with what a placer sees under a price cap.

    A node's prices are sorted ascending and a sale always takes the cheapest unsold GPUs
    within the cap, so the sold GPUs are a prefix of that list. Under a cap the placer may see
    `max(0, at_or_below(cap) - sold)` GPUs of a node; the rest are withheld by `commit`.
    """

    def __init__(self, nodes: Sequence[NodeOffer], placer: Placer) -> None:
        self.placer = placer
        self.prices = {node.name: node.reserve_micros for node in nodes}
        self.runtime = {node.name: node.runtime for node in nodes}
        self.runtimes_offered = frozenset(self.runtime.values())
        self.sold = dict.fromkeys(self.prices, 0)
        self.visible = {name: len(prices) for name, prices in self.prices.items()}
        self.withheld_gpus = 0
        # every price tier, dearest first, for lowering the cap incrementally
        tiers = {(price, name) for name, prices in self.prices.items() for price in prices}
        self._tiers_dearest_first = sorted(tiers, key=lambda tier: (-tier[0], tier[1]))
        self._next_tier = 0

    def _target(self, name: str, cap: int) -> int:
        return max(0, bisect.bisect_right(self.prices[name], cap) - self.sold[name])

    def _show(self, names: Iterable[str], cap: int) -> None:
        withhold: dict[str, int] = {}
        give_back: dict[str, int] = {}
        for name in names:
            change = self._target(name, cap) - self.visible[name]
            if change < 0:
                withhold[name] = -change
            elif change > 0:
                give_back[name] = change
            self.visible[name] += change
        if withhold:
            self.placer.commit(withhold)
        if give_back:
            self.placer.release(give_back)
        self.withheld_gpus += sum(withhold.values()) - sum(give_back.values())

    def lower_cap(self, cap: int) -> None:
        """Withhold the unsold GPUs priced above `cap`; caps must not rise between calls.
        Touches only nodes with a price tier above the cap, each tier once over all calls."""
        touched = []
        tiers = self._tiers_dearest_first
        while self._next_tier < len(tiers) and tiers[self._next_tier][0] > cap:
            touched.append(tiers[self._next_tier][1])
            self._next_tier += 1
        self._show(dict.fromkeys(touched), cap)

    def lowest_unsold_reserve(self) -> int | None:
        """The cheapest reserve price among the GPUs not sold yet (None: all sold)."""
        return min((prices[self.sold[name]] for name, prices in self.prices.items()
                    if self.sold[name] < len(prices)), default=None)

    def set_cap(self, cap: int) -> None:
        """Show exactly the unsold GPUs priced at or below `cap` (visits every node)."""
        self._show(self.prices, cap)
        self._next_tier = 0  # lower_cap restarts from the dearest tier

    def unfit_for(self, bid: Bid) -> dict[str, int]:
        """The GPUs in view on nodes whose runtime cannot run what the bid asks."""
        if bid.runtimes is None or self.runtimes_offered <= bid.runtimes:
            return {}  # every node can (a bid naming no Slurm account, where none is Slurm)
        return {name: visible for name, visible in self.visible.items()
                if visible and self.runtime[name] not in bid.runtimes}

    def place(self, bid: Bid) -> tuple[Assignment | None, str]:
        """The placer's answer for the bid over the GPUs in view on the nodes that can run
        it: the others are taken out of view for this one question. A bid every node can run
        goes straight to the placer."""
        unfit = self.unfit_for(bid)
        if not unfit:
            return self.placer.place(bid)
        self.placer.commit(unfit)
        try:
            return self.placer.place(bid)
        finally:
            self.placer.release(unfit)

    def runtime_refusal(self, bid: Bid) -> str | None:
        """Why the bid was refused when the runtime is the cause (it would fit in view were
        every node's runtime able to run it), else None."""
        unfit = self.unfit_for(bid)
        if not unfit or self.placer.place(bid)[0] is None:
            return None
        assert bid.runtimes is not None
        fitting = sum(self.visible.values()) - sum(unfit.values())
        return (f"only {fitting} of {bid.gpus} GPUs are on nodes that can run it; "
                f"{why_runtimes(bid.runtimes)}")

    def unsold_prices(self) -> list[int]:
        return sorted({price for name, prices in self.prices.items()
                       for price in prices[self.sold[name]:]})

    def sell(self, assignment: Assignment) -> dict[str, tuple[int, ...]]:
        """Take the GPUs of a placement (cheapest first on each node); returns their prices."""
        self.placer.commit(assignment)
        taken = {}
        for name, gpus in assignment.items():
            if not gpus:
                continue
            start = self.sold[name]
            taken[name] = self.prices[name][start:start + gpus]
            self.sold[name] += gpus
            self.visible[name] -= gpus
        return taken


# --- batch auction -------------------------------------------------------------------------


def auction_order(bid: Bid) -> tuple:
    """Descending limit, then earlier submission (unknown last), then id."""
    submitted = bid.submitted_at
    return (-bid.limit_micros, submitted is None, submitted or EPOCH, bid.id)


def check_topology(topology: Topology, levels: Sequence[str], field: str) -> None:
    """The levels a topology names must exist; preferred at or below required."""
    for name in ("required", "preferred", "slice_level"):
        level = getattr(topology, name)
        if level is not None and level not in levels:
            where = "slice.level" if name == "slice_level" else name
            raise InvalidInput(f"{field}.{where}", f"unknown level {level!r}")
    if topology.required and topology.preferred:
        if levels.index(topology.preferred) < levels.index(topology.required):
            raise InvalidInput(f"{field}.preferred", "must be at or below the required level")


def _welfare(bid: Bid, reserves: Mapping[str, tuple[int, ...]]) -> Decimal:
    surplus = sum(bid.limit_micros - price for prices in reserves.values() for price in prices)
    return dollars(surplus * bid.hours)


def market_of(bid: Bid, models: Sequence[str]) -> str | None:
    """One market per GPU model: a bid names exactly one, or none when there is one."""
    if bid.gpu_models is None or not bid.gpu_models:
        return models[0] if len(models) == 1 else None
    return next(iter(bid.gpu_models)) if len(bid.gpu_models) == 1 else None


def clear_auction(
    levels: Sequence[str],
    nodes: Sequence[NodeOffer],
    bids: Sequence[Bid],
    make_placer: MakePlacer,
    exact: bool = True,
) -> AuctionClearing:
    """Clear one interval's bids, one market per GPU model (see the module notes).

    `exact`: also solve each small market (<= 60 bids and <= 200 nodes) as an integer program
    and report the greedy clearing's welfare gap."""
    for bid in bids:
        check_topology(bid.topology, levels, f"bid {bid.id}.topology")
    models = sorted({node.gpu_model for node in nodes})
    by_market: dict[str, list[Bid]] = {model: [] for model in models}
    refused = []
    for bid in sorted(bids, key=auction_order):
        model = market_of(bid, models)
        if model in by_market:
            by_market[model].append(bid)
        elif model is None and bid.gpu_models and len(bid.gpu_models) > 1:
            refused.append(RefusedBid(bid, "an auction bid names one GPU model "
                                           "(one market per model)", False))
        elif model is None:
            refused.append(RefusedBid(bid, "no GPU model named and the snapshot has several",
                                      False))
        else:
            refused.append(RefusedBid(bid, f"no {model} GPUs offered", False))
    markets = []
    for model in models:
        market_nodes = [node for node in nodes if node.gpu_model == model]
        market_bids = by_market[model]
        cleared = clear_market(levels, market_nodes, market_bids, make_placer, model)
        if exact and len(market_bids) <= EXACT_MAX_BIDS and len(market_nodes) <= EXACT_MAX_NODES:
            cleared = with_exact(cleared, solve_exact(levels, market_nodes, market_bids))
        markets.append(cleared)
    return AuctionClearing(markets=tuple(markets), refused=tuple(refused))


def clear_market(
    levels: Sequence[str],
    nodes: Sequence[NodeOffer],
    bids: Sequence[Bid],
    make_placer: MakePlacer,
    gpu_model: str = "",
) -> MarketClearing:
    """Greedy uniform-price clearing of one market's bids over its nodes.

    The GPUs a placer sees only ever shrink during a clearing (sales, and a cap that falls
    with the limits), so once a bid is refused, a later bid with the same constraint and at
    least as many GPUs is refused without asking the placer again (its reason says so). This
    assumes what the engine guarantees: a placer refuses only when no allowed domain holds the
    bid, so it never refuses a bid that fits in capacity where a larger one fitted."""
    for bid in bids:
        check_topology(bid.topology, levels, f"bid {bid.id}.topology")
    stock = Stock(nodes, make_placer(levels, nodes))
    winners: list[tuple[Bid, Mapping[str, int], dict[str, tuple[int, ...]]]] = []
    refused: list[RefusedBid] = []
    smallest_refused: dict[tuple, RefusedBid] = {}  # by constraint: the smallest bid refused
    for bid in sorted(bids, key=auction_order):
        constraint = (bid.topology, bid.gpu_models, bid.runtimes)
        earlier = smallest_refused.get(constraint)
        if earlier is not None and bid.gpus >= earlier.bid.gpus:
            refused.append(RefusedBid(bid, f"no room: bid {earlier.bid.id} for "
                                           f"{_gpus(earlier.bid.gpus)} with the same constraint "
                                           f"and a limit as high was refused ({earlier.reason})"))
            continue
        stock.lower_cap(bid.limit_micros)
        assignment, reason = stock.place(bid)
        if assignment is None:
            lowest = stock.lowest_unsold_reserve()
            runtime_refusal = stock.runtime_refusal(bid)
            if lowest is not None and bid.limit_micros < lowest:
                reason = (f"the limit {to_dollars(bid.limit_micros)} is below the lowest reserve "
                          f"price in this market, {to_dollars(lowest)} per GPU-hour")
            elif runtime_refusal is not None:
                reason = runtime_refusal
            elif stock.withheld_gpus:
                reason += (f"; {_gpus(stock.withheld_gpus)} more "
                           f"{'is' if stock.withheld_gpus == 1 else 'are'} priced above the "
                           f"limit of {to_dollars(bid.limit_micros)}")
            refusal = RefusedBid(bid, reason)
            refused.append(refusal)
            smallest_refused[constraint] = refusal
        else:
            placed = {name: gpus for name, gpus in assignment.items() if gpus}
            winners.append((bid, placed, stock.sell(placed)))
    price = clearing_price(
        [refusal.bid.limit_micros for refusal in refused],
        [price for _, _, taken in winners for prices in taken.values() for price in prices],
    )
    accepted = tuple(
        AcceptedBid(bid, assignment, taken, _winner_price(price, bid))
        for bid, assignment, taken in winners
    )
    return MarketClearing(gpu_model, price, accepted, tuple(refused))


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _winner_price(price: int | None, bid: Bid) -> int:
    assert price is not None  # a winner sold GPUs, so there is a highest reserve sold
    return min(price, bid.limit_micros)


def clearing_price(refused_limits: Sequence[int], sold_reserves: Sequence[int]) -> int | None:
    """The highest refused limit, raised to the highest reserve sold; None if neither."""
    candidates = [max(refused_limits, default=None), max(sold_reserves, default=None)]
    present = [value for value in candidates if value is not None]
    return max(present) if present else None


def with_exact(cleared: MarketClearing, solution: ExactSolution) -> MarketClearing:
    greedy = cleared.welfare
    # the greedy clearing is a feasible answer, so the optimum is never below it (a solver
    # stopped by its time limit may report less)
    best = max(solution.welfare, greedy)
    gap = ((best - greedy) / best).quantize(ONE_MICRO, ROUNDING) if best else Decimal(0)
    comparison = ExactComparison(best, greedy, gap, solution.optimal)
    return MarketClearing(cleared.gpu_model, cleared.clearing_price_micros, cleared.accepted,
                          cleared.refused, comparison)


def spot_leases_to_preempt(
    leases: Iterable[SpotLease], clearing_price_micros: int | None
) -> tuple[str, ...]:
    """Running spot leases whose limit is now below the clearing price, lowest limit first."""
    if clearing_price_micros is None:
        return ()
    outbid = [lease for lease in leases if lease.limit_micros < clearing_price_micros]
    return tuple(lease.id for lease in sorted(outbid, key=lambda x: (x.limit_micros, x.id)))


# --- exact welfare (integer program, HiGHS) ------------------------------------------------


def domain_key(node: NodeOffer, levels: Sequence[str], level: str) -> tuple[str, ...]:
    """The path naming `node`'s domain at `level` (the node itself at the last level)."""
    depth = levels.index(level)
    if depth == len(levels) - 1:
        return tuple(node.labels[name] for name in levels[:-1]) + (node.name,)
    return tuple(node.labels[name] for name in levels[:depth + 1])


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """HiGHS prints a banner on C-level stdout the first time a solver is built; keep it
    off stdout, which the JSON command owns (and off stderr, which carries errors only)."""
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


def solve_exact(
    levels: Sequence[str],
    nodes: Sequence[NodeOffer],
    bids: Sequence[Bid],
    time_limit_s: float = 10.0,
) -> ExactSolution:
    """Maximum welfare over all-or-nothing bids, node capacities per reserve tier, reserve <=
    limit, a required level (all of a bid's GPUs in one domain of it) and slices (each domain
    of the slice level holds a multiple of the slice size). `preferred` is a wish, not a
    constraint, and is ignored. Solved with HiGHS; `welfare` is re-priced exactly."""
    import highspy  # imported here: only this function needs the solver
    import numpy as np

    columns_cost: list[float] = []
    upper: list[float] = []
    integral: list[int] = []
    rows: list[tuple[float, float, dict[int, float]]] = []
    inf = highspy.kHighsInf

    def column(cost: float, ub: float, is_integral: bool = True) -> int:
        columns_cost.append(cost)
        upper.append(ub)
        if is_integral:
            integral.append(len(columns_cost) - 1)
        return len(columns_cost) - 1

    tiers = {node.name: sorted(_counts(node.reserve_micros).items()) for node in nodes}
    capacity_rows: dict[tuple[str, int], dict[int, float]] = {}
    accept_columns = []
    takes: list[tuple[int, Bid, int]] = []  # (column, bid, reserve)
    for bid in bids:
        accept = column(0.0, 1.0)
        accept_columns.append(accept)
        per_node: dict[str, list[int]] = {}
        for node in nodes:
            if bid.runtimes is not None and node.runtime not in bid.runtimes:
                continue  # its agent cannot run what the bid asks
            for price, count in tiers[node.name]:
                if price > bid.limit_micros:
                    break
                surplus = float((bid.limit_micros - price) * bid.hours) / MICROS_PER_DOLLAR
                take = column(surplus, float(min(count, bid.gpus)))
                takes.append((take, bid, price))
                per_node.setdefault(node.name, []).append(take)
                capacity_rows.setdefault((node.name, price), {})[take] = 1.0
        all_takes = {take: 1.0 for group in per_node.values() for take in group}
        rows.append((0.0, 0.0, {**all_takes, accept: -float(bid.gpus)}))
        topology = bid.topology
        if topology.required is not None:
            choices = {}
            for members in _group(nodes, levels, topology.required).values():
                chosen = column(0.0, 1.0)
                choices[chosen] = 1.0
                inside = {take: 1.0 for node in members for take in per_node.get(node.name, [])}
                rows.append((-inf, 0.0, {**inside, chosen: -float(bid.gpus)}))
            rows.append((0.0, 0.0, {**choices, accept: -1.0}))
        if topology.slice_size is not None and topology.slice_size > 1:
            slice_level = topology.slice_level or levels[-1]
            for members in _group(nodes, levels, slice_level).values():
                inside = {take: 1.0 for node in members for take in per_node.get(node.name, [])}
                if inside:
                    groups = column(0.0, float(bid.gpus // topology.slice_size))
                    rows.append((0.0, 0.0, {**inside, groups: -float(topology.slice_size)}))
    counts = {node.name: _counts(node.reserve_micros) for node in nodes}
    for (name, price), members in capacity_rows.items():
        rows.append((-inf, float(counts[name][price]), members))

    if not columns_cost:
        return ExactSolution(Decimal(0), True, ())
    with _quiet_stdout():
        solver = highspy.Highs()
    solver.setOptionValue("output_flag", False)
    solver.setOptionValue("mip_rel_gap", 0.0)
    solver.setOptionValue("time_limit", float(time_limit_s))
    solver.setOptionValue("threads", 1)
    n = len(columns_cost)
    empty_int = np.array([], dtype=np.int32)
    solver.addCols(n, np.array(columns_cost), np.zeros(n), np.array(upper), 0, empty_int,
                   empty_int, np.array([], dtype=np.float64))
    solver.changeColsIntegrality(len(integral), np.array(integral, dtype=np.int32),
                                 np.array([highspy.HighsVarType.kInteger] * len(integral)))
    for lower, upper_bound, coefficients in rows:
        indices = np.array(list(coefficients), dtype=np.int32)
        values = np.array(list(coefficients.values()), dtype=np.float64)
        solver.addRow(lower, upper_bound, len(indices), indices, values)
    solver.changeObjectiveSense(highspy.ObjSense.kMaximize)
    solver.run()
    status = solver.getModelStatus()
    optimal = status == highspy.HighsModelStatus.kOptimal
    if solver.getInfo().primal_solution_status != 2:  # no feasible point found
        return ExactSolution(Decimal(0), False, ())
    values = solver.getSolution().col_value
    surplus = Decimal(0)
    for take, bid, price in takes:
        gpus = round(values[take])
        surplus += (bid.limit_micros - price) * gpus * bid.hours
    accepted = tuple(bid.id for bid, accept in zip(bids, accept_columns, strict=True)
                     if round(values[accept]) == 1)
    return ExactSolution(dollars(surplus), optimal, accepted)


def _counts(prices: Iterable[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for price in prices:
        counts[price] = counts.get(price, 0) + 1
    return counts


def _group(nodes: Sequence[NodeOffer], levels: Sequence[str], level: str) -> dict:
    groups: dict[tuple[str, ...], list[NodeOffer]] = {}
    for node in nodes:
        groups.setdefault(domain_key(node, levels, level), []).append(node)
    return groups


# --- on-demand matching --------------------------------------------------------------------


def arrival_order(bid: Bid) -> tuple:
    submitted = bid.submitted_at
    return (submitted is None, submitted or EPOCH, bid.id)


def match_on_demand(
    levels: Sequence[str],
    nodes: Sequence[NodeOffer],
    orders: Sequence[Bid],
    make_placer: MakePlacer,
) -> OnDemandResult:
    """Match on-demand orders at posted prices, first come first served (submission, id).

    For each order: the lowest price cap at which the placer finds room for the whole order
    (so the dearest GPU it pays is as cheap as it can be), then the placer's tightest
    placement under that cap, taking each node's cheapest GPUs; the tenant pays those GPUs'
    posted prices. No cap at or below the order's limit: refused, saying what it would take.
    """
    for order in orders:
        check_topology(order.topology, levels, f"bid {order.id}.topology")
    stock = Stock(nodes, make_placer(levels, nodes))
    matched, refused = [], []
    for order in sorted(orders, key=arrival_order):
        caps = stock.unsold_prices()
        affordable = [cap for cap in caps if cap <= order.limit_micros]
        found = _lowest_cap(stock, order, affordable)
        if found is None:
            refused.append(RefusedBid(order, _on_demand_refusal(stock, order, caps)))
        else:
            assignment = found
            taken = stock.sell(assignment)
            lines = tuple(PricedGpus(name, price, count)
                          for name, prices in taken.items()
                          for price, count in sorted(_counts(prices).items()))
            matched.append(OnDemandMatch(order, dict(assignment), lines))
        stock.set_cap(max(caps, default=0))
    return OnDemandResult(tuple(matched), tuple(refused))


def _lowest_cap(stock: Stock, order: Bid, caps: Sequence[int]) -> dict[str, int] | None:
    """Binary search over the caps: more GPUs in view never makes a placement impossible."""
    if not caps:
        return None
    stock.set_cap(caps[-1])
    assignment, _ = stock.place(order)
    if assignment is None:
        return None
    low, high = 0, len(caps) - 1  # caps[high] fits
    best = assignment
    while low < high:
        middle = (low + high) // 2
        stock.set_cap(caps[middle])
        assignment, _ = stock.place(order)
        if assignment is None:
            low = middle + 1
        else:
            high, best = middle, assignment
    stock.set_cap(caps[high])
    return {name: gpus for name, gpus in best.items() if gpus}


def _on_demand_refusal(stock: Stock, order: Bid, caps: Sequence[int]) -> str:
    limit = dollars(order.limit_micros)
    within = [cap for cap in caps if cap <= order.limit_micros]
    if within:
        # GPUs within the limit that the bid may not use (a Slurm node, a node running no
        # commands) are the cause, not the price: say so
        stock.set_cap(within[-1])
        if (runtime := stock.runtime_refusal(order)) is not None:
            return runtime
    dearer = [cap for cap in caps if cap > order.limit_micros]
    if dearer:
        stock.set_cap(dearer[-1])
        if stock.place(order)[0] is not None:
            needed = _lowest_cap(stock, order, dearer)
            assert needed is not None
            dearest = max(stock.prices[name][stock.sold[name] + gpus - 1]
                          for name, gpus in needed.items())
            return (f"the cheapest placement needs GPUs at up to {dollars(dearest)} per "
                    f"GPU-hour, above the limit {limit}")
    if caps:
        stock.set_cap(caps[-1])
    return stock.runtime_refusal(order) or stock.place(order)[1]

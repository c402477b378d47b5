"""The market clearing rules, on hand-worked cases and random ones.

These tests exercise `market.core.clearing` on its own, with `DomainPlacer` below standing in
for the placement engine (market never imports scheduler); the engine-backed adapter is tested
in tests/scheduler/core/test_clearing_placer.py.
"""

from __future__ import annotations

import random
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.core.money import MICROS_PER_DOLLAR, to_micros
from market.core.clearing import (
    EXACT_MAX_BIDS,
    Bid,
    NodeOffer,
    SpotLease,
    Topology,
    clear_auction,
    clear_market,
    clearing_price,
    dollars,
    domain_key,
    match_on_demand,
    micros,
    solve_exact,
    spot_leases_to_preempt,
)
from market.core.whatif import InvalidInput

REPO_ROOT = Path(__file__).resolve().parents[3]

LEVELS = ("spine", "leaf", "node")
H100 = "H100-80GB"


class DomainPlacer:
    """A minimal placer: the domain of the required level with the fewest free GPUs that
    holds the whole bid (the whole snapshot when none is required), filled from its nodes
    with the most free GPUs first; ties by name. Slices are not supported."""

    def __init__(self, levels, offers):
        self.levels = tuple(levels)
        self.offers = {offer.name: offer for offer in offers}
        self.free = {offer.name: offer.free_gpus for offer in offers}

    def place(self, bid):
        assert bid.topology.slice_size is None
        level = bid.topology.required
        groups: dict[tuple, list[str]] = {}
        for name, offer in sorted(self.offers.items()):
            key = () if level is None else domain_key(offer, self.levels, level)
            groups.setdefault(key, []).append(name)
        free_in = {key: sum(self.free[n] for n in names) for key, names in groups.items()}
        fitting = [key for key in groups if free_in[key] >= bid.gpus]
        if not fitting:
            within = "" if level is None else f" within one {level}"
            return None, f"only {max(free_in.values(), default=0)} of {bid.gpus} GPUs fit{within}"
        chosen = min(fitting, key=lambda key: (free_in[key], key))
        out, remaining = {}, bid.gpus
        for name in sorted(groups[chosen], key=lambda n: (-self.free[n], n)):
            take = min(self.free[name], remaining)
            if take:
                out[name] = take
                remaining -= take
        return out, ""

    def commit(self, assignment):
        for name, gpus in assignment.items():
            assert 0 <= gpus <= self.free[name]
            self.free[name] -= gpus

    def release(self, assignment):
        for name, gpus in assignment.items():
            self.free[name] += gpus
            assert self.free[name] <= self.offers[name].free_gpus


def offer(path: str, *prices: str, model: str = H100) -> NodeOffer:
    """`offer("s1/l1/n1", "2.00", "2.00", "3.00")`: one node and the price of each free GPU."""
    spine, leaf, name = path.split("/")
    return NodeOffer(name, {"spine": spine, "leaf": leaf}, model,
                     tuple(micros(price) for price in prices))


def bid(bid_id, gpus, limit, hours=1, required=None, at=None, models=None) -> Bid:
    return Bid(id=bid_id, gpus=gpus, hours=Decimal(hours), limit_micros=micros(limit),
               gpu_models=None if models is None else frozenset(models),
               topology=Topology(required=required), submitted_at=at)


def clear(nodes, bids, exact=False):
    return clear_auction(LEVELS, nodes, bids, DomainPlacer, exact=exact).market(H100)


def accepted_ids(market):
    return [accepted.bid.id for accepted in market.accepted]


def refused_ids(market):
    return [refusal.bid.id for refusal in market.refused]


def price_of(market):
    return dollars(market.clearing_price_micros)


def paid(market):
    return {accepted.bid.id: dollars(accepted.price_micros) for accepted in market.accepted}


# --- admission order and all-or-nothing -----------------------------------------------------


def test_bids_are_admitted_in_descending_limit_until_capacity_runs_out():
    nodes = [offer("s1/l1/n1", *["1.00"] * 8)]
    market = clear(nodes, [bid("low", 4, "2.00"), bid("high", 4, "3.00"), bid("mid", 4, "2.50")])
    assert accepted_ids(market) == ["high", "mid"]
    assert refused_ids(market) == ["low"]


def test_equal_limits_go_to_the_earlier_submission_then_the_lower_id():
    from datetime import UTC, datetime

    early = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
    late = datetime(2026, 11, 30, 1, 5, tzinfo=UTC)
    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    market = clear(nodes, [bid("a", 2, "2.00", at=late), bid("c", 2, "2.00", at=early),
                           bid("b", 2, "2.00", at=early)])
    assert accepted_ids(market) == ["b", "c"]
    assert refused_ids(market) == ["a"]
    undated = clear(nodes, [bid("z", 4, "2.00", at=early), bid("a", 4, "2.00")])
    assert accepted_ids(undated) == ["z"]  # a bid without a submission time comes last


def test_a_bid_is_taken_whole_or_not_at_all_and_a_smaller_lower_bid_may_still_win():
    nodes = [offer("s1/l1/n1", *["1.00"] * 6)]
    market = clear(nodes, [bid("big", 8, "3.00"), bid("small", 6, "2.00")])
    assert refused_ids(market) == ["big"]
    assert accepted_ids(market) == ["small"]
    assert market.accepted[0].assignment == {"n1": 6}
    assert market.gpus_sold == 6


def test_after_a_refusal_bigger_bids_with_the_same_constraint_are_refused_without_a_search():
    asked = []

    class CountingPlacer(DomainPlacer):
        def place(self, bid):
            asked.append(bid.id)
            return super().place(bid)

    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    market = clear_auction(LEVELS, nodes, [
        bid("six", 6, "3.00"), bid("six-on-a-node", 6, "2.80", required="node"),
        bid("eight", 8, "2.50"), bid("two", 2, "2.00"),
    ], CountingPlacer, exact=False).market(H100)
    assert asked == ["six", "six-on-a-node", "two"]
    assert accepted_ids(market) == ["two"]
    assert {refusal.bid.id: refusal.reason for refusal in market.refused} == {
        "six": "only 4 of 6 GPUs fit",
        "six-on-a-node": "only 4 of 6 GPUs fit within one node",
        "eight": "no room: bid six for 6 GPUs with the same constraint and a limit as high "
                 "was refused (only 4 of 6 GPUs fit)",
    }


# --- the clearing price ---------------------------------------------------------------------


EIGHT_AT_1 = [offer("s1/l1/n1", *["1.00"] * 8)]
TWO_TIERS = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l2/n2", *["1.50"] * 4),
             offer("s2/l3/n3", "2.90")]


@pytest.mark.parametrize(
    "nodes, bids, expected_price, expected_paid",
    [
        # the highest refused limit (2.00) sets the price; both winners pay it
        (EIGHT_AT_1, [("a", 4, "3.00"), ("b", 4, "2.50"), ("c", 4, "2.00"), ("d", 4, "1.50")],
         "2.00", {"a": "2.00", "b": "2.00"}),
        # a refused bid above a winner's limit sets the price; that winner pays its limit
        (EIGHT_AT_1, [("big", 10, "3.00"), ("x", 4, "2.20"), ("y", 4, "2.00")],
         "3.00", {"x": "2.20", "y": "2.00"}),
        # nothing refused: the highest reserve among the GPUs sold (n2's 1.50; n3 is unsold)
        (TWO_TIERS, [("a", 4, "3.00"), ("b", 4, "2.00")], "1.50", {"a": "1.50", "b": "1.50"}),
    ],
)
def test_every_winner_pays_the_uniform_price_capped_at_its_own_limit(
    nodes, bids, expected_price, expected_paid
):
    market = clear(nodes, [bid(*spec) for spec in bids])
    assert price_of(market) == Decimal(expected_price)
    assert paid(market) == {key: Decimal(value) for key, value in expected_paid.items()}


def test_without_refusals_an_unsold_dearer_gpu_does_not_raise_the_price():
    nodes = [offer("s1/l1/n1", "1.00", "1.00"), offer("s1/l1/n2", "2.90")]
    market = clear(nodes, [bid("a", 2, "3.00")])
    assert market.accepted[0].assignment == {"n1": 2}
    assert price_of(market) == Decimal("1.00")


def test_the_price_is_raised_to_the_dearest_reserve_sold_so_no_gpu_goes_below_its_reserve():
    # "a" takes both GPUs (reserves 1.00 and 3.00); "b" is refused at 2.00: a price of 2.00
    # would sell the 3.00 GPU below its reserve, so the price is 3.00
    nodes = [offer("s1/l1/n1", "1.00", "3.00")]
    market = clear(nodes, [bid("a", 2, "4.00"), bid("b", 1, "2.00")])
    assert refused_ids(market) == ["b"]
    assert price_of(market) == Decimal("3.00")
    assert paid(market) == {"a": Decimal("3.00")}


def test_no_sale_and_no_refusal_means_no_clearing_price():
    market = clear([offer("s1/l1/n1", "1.00")], [])
    assert market.clearing_price_micros is None
    assert clearing_price([], []) is None
    assert clearing_price([2_000_000], [2_500_000]) == 2_500_000


# --- reserve prices -------------------------------------------------------------------------


def test_a_bid_only_takes_gpus_whose_reserve_is_at_or_below_its_limit():
    nodes = [offer("s1/l1/n1", "2.50", "2.50", "2.50", "2.50")]
    market = clear(nodes, [bid("under", 2, "2.49"), bid("at", 2, "2.50")])
    # "at" (2.50) goes first and takes two; "under" sees none of the rest
    assert accepted_ids(market) == ["at"]
    assert market.refused[0].reason == ("the limit 2.49 is below the lowest reserve price in "
                                        "this market, 2.50 per GPU-hour")


def test_on_a_node_a_winner_gets_the_cheapest_gpus_within_its_limit():
    nodes = [offer("s1/l1/n1", "3.00", "1.00", "2.00", "1.50", "9.00")]
    market = clear(nodes, [bid("a", 3, "5.00", hours=2)])
    won = market.accepted[0]
    assert won.reserves_micros == {"n1": (1_000_000, 1_500_000, 2_000_000)}
    # welfare: (5 - 1) + (5 - 1.5) + (5 - 2) = 10.50 per hour, two hours
    assert market.welfare == Decimal("21.00")
    assert price_of(market) == Decimal("2.00")
    assert won.total == Decimal("12.00")  # 2.00 x 3 GPUs x 2 h


# --- topology -------------------------------------------------------------------------------


def test_a_required_leaf_keeps_every_gpu_of_a_bid_inside_one_leaf():
    nodes = [offer("s1/l1/n1", *["1.00"] * 3), offer("s1/l1/n2", *["1.00"] * 3),
             offer("s1/l2/n3", *["1.00"] * 4)]
    market = clear(nodes, [bid("a", 5, "3.00", required="leaf"),
                           bid("b", 4, "2.50", required="leaf"),
                           bid("c", 2, "2.00", required="leaf")])
    assert {a.bid.id: dict(a.assignment) for a in market.accepted} == {
        "a": {"n1": 3, "n2": 2}, "b": {"n3": 4}}
    assert market.refused[0].reason == "only 1 of 2 GPUs fit within one leaf"
    assert price_of(market) == Decimal("2.00")


def test_a_topology_naming_an_unknown_level_is_invalid_input():
    bad = Bid("x", 1, Decimal(1), 1, topology=Topology(required="rack"))
    with pytest.raises(InvalidInput) as error:
        clear([offer("s1/l1/n1", "1.00")], [bad])
    assert error.value.field == "bid x.topology.required"


# --- markets per GPU model ------------------------------------------------------------------


def test_each_gpu_model_clears_as_its_own_market():
    nodes = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l1/n2", *["1.00"] * 4, model="A100")]
    clearing = clear_auction(LEVELS, nodes, [
        bid("h", 4, "3.00", models=[H100]), bid("h2", 2, "2.00", models=[H100]),
        bid("a", 2, "1.50", models=["A100"]),
        bid("both", 2, "9.00", models=["A100", H100]), bid("l40", 1, "2.00", models=["L40S"]),
        bid("any", 1, "2.00"),
    ], DomainPlacer, exact=False)
    assert [market.gpu_model for market in clearing.markets] == ["A100", H100]
    assert accepted_ids(clearing.market("A100")) == ["a"]
    assert price_of(clearing.market("A100")) == Decimal("1.00")
    assert price_of(clearing.market(H100)) == Decimal("2.00")
    reasons = {refusal.bid.id: refusal.reason for refusal in clearing.refused}
    assert reasons == {
        "both": "an auction bid names one GPU model (one market per model)",
        "l40": "no L40S GPUs offered",
        "any": "no GPU model named and the snapshot has several",
    }
    assert not any(refusal.for_lack_of_capacity for refusal in clearing.refused)


# --- spot preemption ------------------------------------------------------------------------


def test_spot_leases_bidding_below_the_new_price_are_preempted_lowest_first():
    leases = [SpotLease("l3", micros("2.00")), SpotLease("l1", micros("1.50")),
              SpotLease("l2", micros("2.10")), SpotLease("l0", micros("1.50"))]
    assert spot_leases_to_preempt(leases, micros("2.10")) == ("l0", "l1", "l3")
    assert spot_leases_to_preempt(leases, None) == ()


# --- money ----------------------------------------------------------------------------------


def test_money_is_decimal_text_in_and_integer_micro_dollars_inside():
    assert micros("2.10") == 2_100_000
    assert micros("0.000001") == 1
    assert dollars(2_100_000) == Decimal("2.10")
    assert dollars(1) == Decimal("0.000001")
    for bad in ("2.1234567", "abc", "-1", "NaN"):
        with pytest.raises(InvalidInput):
            micros(bad)


def test_half_a_micro_dollar_rounds_to_even_as_all_money_in_ibex_does():
    # 5 micro-dollars an hour for half an hour is 2.5 micro-dollars: half-up would say 3
    assert dollars(Decimal("2.5")) == Decimal("0.000002")
    assert dollars(Decimal("3.5")) == Decimal("0.000004")
    assert dollars(Decimal("-2.5")) == Decimal("-0.000002")
    # the same answer billing's own parser gives for the same half micro-dollar
    assert dollars(Decimal("2.5")) == Decimal(to_micros("0.0000025")) / MICROS_PER_DOLLAR


# --- exact welfare --------------------------------------------------------------------------


def test_the_exact_solve_finds_the_better_pair_and_reports_the_greedy_gap():
    # greedy takes the 2.50 bid (3 GPUs: welfare 7.50) and strands one GPU; two 2-GPU bids at
    # 2.00 would fill the node (welfare 8.00): gap (8 - 7.5) / 8 = 6.25 %
    nodes = [offer("s1/l1/n1", *["0.00"] * 4)]
    market = clear(nodes, [bid("a", 3, "2.50"), bid("b", 2, "2.00"), bid("c", 2, "2.00")],
                   exact=True)
    assert market.exact.welfare == Decimal("8.00")
    assert market.exact.greedy_welfare == Decimal("7.50")
    assert market.exact.gap == Decimal("0.062500")
    assert market.exact.optimal


def test_the_exact_solve_respects_required_levels_and_reserves():
    nodes = [offer("s1/l1/n1", "1.00", "1.00"), offer("s1/l2/n2", "1.00", "1.00"),
             offer("s1/l2/n3", "5.00", "5.00")]
    bids = [bid("leaf4", 4, "3.00", required="leaf"), bid("two", 2, "2.00")]
    # leaf4 fits only in l2 at reserve 5 > 3, so only "two" can win: (2 - 1) x 2 = 2.00
    solution = solve_exact(LEVELS, nodes, bids)
    assert solution.accepted_ids == ("two",)
    assert solution.welfare == Decimal("2.00")


def test_markets_too_big_for_the_exact_solve_report_none():
    nodes = [offer("s1/l1/n1", *["1.00"] * 8)]
    many = [bid(f"b{i:03d}", 1, "2.00") for i in range(EXACT_MAX_BIDS + 1)]
    assert clear(nodes, many, exact=True).exact is None


# --- on-demand ------------------------------------------------------------------------------


def test_on_demand_takes_the_cheapest_gpus_that_satisfy_the_constraint_at_posted_prices():
    nodes = [offer("s1/l1/n1", "1.00", "1.00", "3.00"), offer("s1/l1/n2", "2.00", "2.00"),
             offer("s1/l2/n3", "1.20", "1.20", "1.20", "1.20")]
    result = match_on_demand(LEVELS, nodes, [bid("o", 4, "5.00", hours=3, required="leaf")],
                             DomainPlacer)
    match = result.matched[0]
    assert match.assignment == {"n3": 4}
    assert [(line.node, dollars(line.price_micros), line.gpus) for line in match.lines] == [
        ("n3", Decimal("1.20"), 4)]
    assert dollars(match.cost_per_hour_micros) == Decimal("4.80")
    assert match.total == Decimal("14.40")


def test_on_demand_pays_each_gpus_posted_price_and_later_orders_see_what_is_left():
    nodes = [offer("s1/l1/n1", "1.00", "1.50", "2.00")]
    result = match_on_demand(LEVELS, nodes, [bid("a", 2, "5.00"), bid("b", 1, "5.00")],
                             DomainPlacer)
    first, second = result.matched
    assert [(line.price_micros, line.gpus) for line in first.lines] == [
        (1_000_000, 1), (1_500_000, 1)]
    assert dollars(first.cost_per_hour_micros) == Decimal("2.50")
    assert [(line.price_micros, line.gpus) for line in second.lines] == [(2_000_000, 1)]


def test_on_demand_refuses_rather_than_pay_more_than_the_limit_and_says_what_it_would_take():
    nodes = [offer("s1/l1/n1", "1.00"), offer("s1/l1/n2", "2.50", "2.50")]
    result = match_on_demand(LEVELS, nodes, [bid("o", 2, "2.00"), bid("x", 9, "9.00")],
                             DomainPlacer)
    reasons = {refusal.bid.id: refusal.reason for refusal in result.refused}
    assert reasons == {
        "o": "the cheapest placement needs GPUs at up to 2.50 per GPU-hour, above the limit 2.00",
        "x": "only 3 of 9 GPUs fit",
    }
    assert result.matched == ()


# --- properties over random instances -------------------------------------------------------


@st.composite
def instances(draw):
    node_count = draw(st.integers(1, 8))
    nodes = []
    for i in range(node_count):
        prices = draw(st.lists(st.integers(1, 6), min_size=0, max_size=4))
        nodes.append(NodeOffer(f"n{i}", {"spine": f"s{i % 2}", "leaf": f"l{i % 4}"}, H100,
                               tuple(p * 500_000 for p in prices)))
    bids = []
    for i in range(draw(st.integers(0, 10))):
        bids.append(Bid(
            id=f"b{i}", gpus=draw(st.integers(1, 6)), hours=Decimal(draw(st.integers(1, 3))),
            limit_micros=draw(st.integers(1, 8)) * 500_000,
            topology=Topology(required=draw(st.sampled_from([None, "leaf", "spine", "node"]))),
            submitted_at=None,
        ))
    return nodes, bids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.randoms(use_true_random=False))
def test_clearing_never_oversells_winners_pay_at_most_their_limit_and_order_does_not_matter(
    instance, rng
):
    nodes, bids = instance
    market = clear(nodes, bids)
    by_name = {node.name: node for node in nodes}
    taken = dict.fromkeys(by_name, 0)
    for won in market.accepted:
        assert sum(won.assignment.values()) == won.bid.gpus
        assert won.price_micros <= won.bid.limit_micros
        for name, prices in won.reserves_micros.items():
            assert len(prices) == won.assignment[name]
            assert all(price <= won.price_micros for price in prices)  # never below reserve
        if won.bid.topology.required:
            level = won.bid.topology.required
            assert len({domain_key(by_name[n], LEVELS, level) for n in won.assignment}) == 1
        for name, gpus in won.assignment.items():
            taken[name] += gpus
    assert all(taken[name] <= by_name[name].free_gpus for name in taken)
    assert len(market.accepted) + len(market.refused) == len(bids)

    shuffled_nodes, shuffled_bids = list(nodes), list(bids)
    rng.shuffle(shuffled_nodes)
    rng.shuffle(shuffled_bids)
    assert clear(shuffled_nodes, shuffled_bids) == market


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_the_exact_welfare_is_never_below_the_greedy_clearing(instance):
    nodes, bids = instance
    market = clear(nodes, bids)
    solution = solve_exact(LEVELS, nodes, bids)
    assert solution.optimal
    assert solution.welfare >= market.welfare


def test_clear_market_is_deterministic_on_a_larger_random_snapshot():
    rng = random.Random(3)
    nodes = [NodeOffer(f"n{i:03d}", {"spine": f"s{i // 32}", "leaf": f"l{i // 8}"}, H100,
                       tuple(rng.choice((1, 2, 3)) * 700_000 for _ in range(rng.randint(0, 8))))
             for i in range(128)]
    bids = [bid(f"b{i:03d}", rng.choice((1, 2, 4, 8, 16)), f"{rng.randint(100, 400) / 100:.2f}",
                required=rng.choice((None, "leaf", "spine"))) for i in range(300)]
    first = clear_market(LEVELS, nodes, bids, DomainPlacer, H100)
    assert first == clear_market(LEVELS, nodes[::-1], bids[::-1], DomainPlacer, H100)
    assert first.gpus_sold <= sum(node.free_gpus for node in nodes)


def test_a_bid_below_every_reserve_is_told_the_lowest_reserve():
    nodes = [offer("s1/l1/n1", "3.66", "3.66", "4.00", "4.00")]

    market = clear(nodes, [bid("low", 8, "2.00")])

    assert market.refused[0].reason == ("the limit 2.00 is below the lowest reserve price in "
                                        "this market, 3.66 per GPU-hour")


def test_importing_the_clearing_core_pulls_in_neither_scheduler_nor_django():
    probe = ("import sys, market.core.clearing; "
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'scheduler', 'django'}))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

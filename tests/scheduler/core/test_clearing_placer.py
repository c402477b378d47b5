"""Market clearing with the placement engine as its placer (`scheduler.core.clearing_placer`).

Hand-worked cases on small fat trees written as {"spine/leaf/node": [prices of free GPUs]},
then properties over random instances with the real engine.
"""

from __future__ import annotations

from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from market.core.clearing import (
    Bid,
    NodeOffer,
    Topology,
    clear_auction,
    dollars,
    domain_key,
    micros,
    solve_exact,
)
from scheduler.core.clearing_placer import (
    IndexPlacer,
    clear_auction_on_index,
    match_on_demand_on_index,
    request_for,
)
from scheduler.core.placement import Slice

LEVELS = ("spine", "leaf", "node")
H100 = "H100-80GB"


def offers(layout: dict[str, list[str]], model: str = H100) -> list[NodeOffer]:
    out = []
    for path, prices in layout.items():
        spine, leaf, name = path.split("/")
        out.append(NodeOffer(name, {"spine": spine, "leaf": leaf}, model,
                             tuple(micros(price) for price in prices)))
    return out


def bid(bid_id, gpus, limit, hours=1, **topology) -> Bid:
    return Bid(id=bid_id, gpus=gpus, hours=Decimal(hours), limit_micros=micros(limit),
               topology=Topology(**topology))


def market_of(nodes, bids, exact=False):
    return clear_auction_on_index(LEVELS, nodes, bids, exact=exact).market(H100)


def assignments(market):
    return {accepted.bid.id: dict(accepted.assignment) for accepted in market.accepted}


def reasons(result):
    return {refusal.bid.id: refusal.reason for refusal in result.refused}


# leaf l1: 16 GPUs at 2.00; l2: n3 4 at 1.00 + n4 3 (1.00, 1.00, 3.00); l3 (spine s2): 8 at 1.50
SNAPSHOT = offers({
    "s1/l1/n1": ["2.00"] * 8, "s1/l1/n2": ["2.00"] * 8,
    "s1/l2/n3": ["1.00"] * 4, "s1/l2/n4": ["1.00", "1.00", "3.00"],
    "s2/l3/n5": ["1.50"] * 8,
})


def test_the_adapter_asks_the_engine_for_the_whole_bid_with_its_constraint():
    request = request_for(bid("b", 16, "2.00", required="spine", preferred="leaf",
                              slice_size=8), LEVELS)
    assert (request.gpus, request.required, request.preferred) == (16, "spine", "leaf")
    assert request.slice == Slice(8, "node")
    placer = IndexPlacer(LEVELS, SNAPSHOT)
    assignment, reason = placer.place(bid("b", 9, "2.00", required="node"))
    assert assignment is None and reason == "only 8 of 9 GPUs fit within one node"


def test_bids_are_placed_best_fit_within_their_required_level_in_descending_price_order():
    market = market_of(SNAPSHOT, [
        bid("leaf16", 16, "2.50", required="leaf"),
        bid("leaf7", 7, "3.50", required="leaf"),
        bid("node8", 8, "1.60", required="node"),
        bid("two", 2, "5.00"),
    ])
    assert assignments(market) == {
        "two": {"n4": 2},            # the tightest node holding 2 (n4: 3 free), cheapest GPUs
        "leaf7": {"n5": 7},          # l3 (8) is tighter than l1 (16); l2 has 5 left
        "leaf16": {"n1": 8, "n2": 8},
    }
    # at 1.60 only n3 (4) and n5's last GPU are left; n4's 3.00 GPU is kept back
    assert reasons(market) == {
        "node8": "only 4 of 8 GPUs fit within one node; 1 GPU more is priced above the limit "
                 "of 1.60"}
    # the refused 1.60 is raised to the dearest reserve sold (2.00 on l1)
    assert dollars(market.clearing_price_micros) == Decimal("2.00")
    assert {a.bid.id: dollars(a.price_micros) for a in market.accepted} == {
        "two": Decimal("2.00"), "leaf7": Decimal("2.00"), "leaf16": Decimal("2.00")}


def test_a_refusal_gives_the_engines_reason_and_the_gpus_kept_back_by_reserve():
    market = market_of(SNAPSHOT, [
        bid("fill", 16, "9.00", required="leaf"),
        bid("leaf7", 7, "2.50", required="leaf"),
        bid("cheap7", 7, "1.20", required="leaf"),
    ])
    assert assignments(market)["fill"] == {"n1": 8, "n2": 8}
    assert assignments(market)["leaf7"] == {"n5": 7}  # l3 (8) fits; l2 has 6 at <= 2.50
    assert reasons(market) == {
        "cheap7": "only 6 of 7 GPUs fit within one leaf; 2 GPUs more are priced above the "
                  "limit of 1.20"}


def test_whole_node_slices_only_count_nodes_with_a_full_slice_free():
    nodes = offers({
        "s1/l1/n1": ["1.00"] * 8, "s1/l1/n2": ["1.00"] * 7,
        "s1/l2/n3": ["1.00"] * 8, "s1/l2/n4": ["1.00"] * 8,
    })
    market = market_of(nodes, [
        bid("two-nodes", 16, "3.00", required="leaf", slice_size=8),
        bid("again", 16, "2.00", required="leaf", slice_size=8),
    ])
    assert assignments(market) == {"two-nodes": {"n3": 8, "n4": 8}}
    assert reasons(market) == {"again": "only 1 of 2 slices fit within one leaf"}


def test_a_preferred_leaf_falls_back_to_the_spine_when_no_leaf_holds_the_bid():
    market = market_of(SNAPSHOT, [bid("p", 20, "2.50", required="spine", preferred="leaf")])
    placed = assignments(market)["p"]
    assert sum(placed.values()) == 20 and set(placed) <= {"n1", "n2", "n3", "n4"}


# --- on-demand ------------------------------------------------------------------------------


def test_on_demand_prefers_the_cheaper_gpus_then_the_tighter_node():
    nodes = offers({
        "s1/l1/n1": ["2.00"] * 8, "s1/l1/n2": ["2.00"] * 4,
        "s1/l2/n3": ["1.00"] * 2, "s1/l2/n4": ["1.80"] * 6,
    })
    result = match_on_demand_on_index(LEVELS, nodes, [
        bid("o1", 4, "3.00", required="node"),  # 1.80 on n4 beats 2.00 on n2
        bid("o2", 4, "3.00", required="node"),  # n4 has 2 left: among 2.00 nodes, n2 is tighter
        bid("o3", 2, "3.00", required="node"),  # the two at 1.00 on n3
    ])
    assert [dict(match.assignment) for match in result.matched] == [
        {"n4": 4}, {"n2": 4}, {"n3": 2}]
    assert [dollars(m.cost_per_hour_micros) for m in result.matched] == [
        Decimal("7.20"), Decimal("8.00"), Decimal("2.00")]


def test_on_demand_refusals_name_the_engines_reason_or_the_price_it_would_take():
    result = match_on_demand_on_index(LEVELS, SNAPSHOT, [
        bid("too-cheap", 8, "1.40", required="leaf"),
        bid("too-big", 20, "9.00", required="leaf"),
    ])
    assert reasons(result) == {
        "too-cheap": "the cheapest placement needs GPUs at up to 1.50 per GPU-hour, "
                     "above the limit 1.40",
        "too-big": "only 16 of 20 GPUs fit within one leaf",
    }


# --- properties with the engine -------------------------------------------------------------


@st.composite
def instances(draw):
    nodes = []
    for i in range(draw(st.integers(1, 10))):
        prices = draw(st.lists(st.integers(1, 6), min_size=0, max_size=8))
        nodes.append(NodeOffer(f"n{i}", {"spine": f"s{i % 2}", "leaf": f"l{i % 4}"}, H100,
                               tuple(p * 500_000 for p in prices)))
    bids = []
    for i in range(draw(st.integers(0, 12))):
        slice_size = draw(st.sampled_from([None, None, 2, 4]))
        units = draw(st.integers(1, 4 if slice_size else 10))
        bids.append(Bid(
            id=f"b{i}", gpus=units * (slice_size or 1), hours=Decimal(draw(st.integers(1, 4))),
            limit_micros=draw(st.integers(1, 8)) * 500_000,
            topology=Topology(required=draw(st.sampled_from([None, "leaf", "spine", "node"])),
                              slice_size=slice_size),
        ))
    return nodes, bids


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.randoms(use_true_random=False))
def test_with_the_engine_clearing_never_oversells_and_respects_limits_reserves_and_topology(
    instance, rng
):
    nodes, bids = instance
    market = market_of(nodes, bids)
    by_name = {node.name: node for node in nodes}
    taken = dict.fromkeys(by_name, 0)
    for won in market.accepted:
        assert sum(won.assignment.values()) == won.bid.gpus
        assert won.price_micros <= won.bid.limit_micros
        assert all(price <= won.price_micros
                   for prices in won.reserves_micros.values() for price in prices)
        topology = won.bid.topology
        if topology.required:
            assert len({domain_key(by_name[n], LEVELS, topology.required)
                        for n in won.assignment}) == 1
        if topology.slice_size:
            assert all(gpus % topology.slice_size == 0 for gpus in won.assignment.values())
        for name, gpus in won.assignment.items():
            taken[name] += gpus
    assert all(taken[name] <= by_name[name].free_gpus for name in by_name)
    shuffled_nodes, shuffled_bids = list(nodes), list(bids)
    rng.shuffle(shuffled_nodes)
    rng.shuffle(shuffled_bids)
    assert market_of(shuffled_nodes, shuffled_bids) == market


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_with_the_engine_the_exact_welfare_is_never_below_the_greedy(instance):
    nodes, bids = instance
    market = clear_auction(LEVELS, nodes, bids, IndexPlacer, exact=True).market(H100)
    assert market.exact is not None and market.exact.optimal
    assert market.exact.welfare >= market.exact.greedy_welfare == market.welfare
    assert solve_exact(LEVELS, nodes, bids).welfare == market.exact.welfare
    assert Decimal(0) <= market.exact.gap <= Decimal(1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_on_demand_matches_never_oversell_nor_pay_above_the_limit(instance):
    nodes, orders = instance
    result = match_on_demand_on_index(LEVELS, nodes, orders)
    by_name = {node.name: node for node in nodes}
    taken = dict.fromkeys(by_name, 0)
    for match in result.matched:
        assert sum(line.gpus for line in match.lines) == match.bid.gpus
        assert all(line.price_micros <= match.bid.limit_micros for line in match.lines)
        for name, gpus in match.assignment.items():
            taken[name] += gpus
    assert all(taken[name] <= by_name[name].free_gpus for name in by_name)
    assert len(result.matched) + len(result.refused) == len(orders)

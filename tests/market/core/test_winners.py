"""Winner determination (`market.core.winners`): the welfare-maximising clearing, its bound,
its price and every loser's price to win, on books worked out by hand and on random ones."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

import pytest

from market.core.clearing import Bid, NodeOffer, Topology, domain_key, micros, solve_exact
from market.core.whatif import InvalidInput
from market.core.winners import (
    AlternativeBid,
    WelfareClearing,
    clear_welfare,
)

LEVELS = ("spine", "leaf", "node")
EXACT_S = 120  # the reference optimum's time limit: ample even on a machine shared by many
H100, H200 = "H100", "H200"


def offer(path: str, *prices: str, model: str = H100) -> NodeOffer:
    """`offer("s1/l1/n1", "2.00", "3.00")`: one node and the reserve of each free GPU."""
    spine, leaf, name = path.split("/")
    return NodeOffer(name, {"spine": spine, "leaf": leaf}, model,
                     tuple(micros(price) for price in prices))


def bid(bid_id, gpus, limit, hours=1, required=None, models=None, slice_size=None) -> Bid:
    return Bid(id=bid_id, gpus=gpus, hours=Decimal(hours), limit_micros=micros(limit),
               gpu_models=None if models is None else frozenset(models),
               topology=Topology(required=required, slice_size=slice_size))


def winners(clearing: WelfareClearing) -> list[str]:
    return sorted(w.bid.id for m in clearing.markets for w in m.accepted)


# --- welfare decides, not the price per hour ------------------------------------------------


@pytest.fixture(params=["integer programme", "decomposition"])
def path(request, monkeypatch):
    """Each hand-worked book is cleared both ways: whole by HiGHS, and as if it were too big
    (the greedy incumbent and the Lagrangian bound)."""
    if request.param == "decomposition":
        import market.core.winners as module

        monkeypatch.setattr(module, "MIP_MAX_COLUMNS", 0)
    return request.param


def test_a_bidder_with_more_hours_beats_one_with_a_higher_hourly_limit(path):
    # 4 GPUs at $1.00. "sprinter" offers $3.00 for 1 hour: (3 - 1) x 4 x 1 = $8 of welfare;
    # "marathon" offers $2.00 for 10 hours: (2 - 1) x 4 x 10 = $40. The greedy ranked the
    # sprinter first; welfare says the marathon.
    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    clearing = clear_welfare(LEVELS, nodes, [bid("sprinter", 4, "3.00", hours=1),
                                             bid("marathon", 4, "2.00", hours=10)])
    assert winners(clearing) == ["marathon"]
    assert clearing.welfare == Decimal("40.00")
    assert clearing.welfare_bound >= Decimal("40.00")
    if path == "integer programme":
        assert clearing.optimal and clearing.gap == 0


def test_the_higher_hourly_limit_wins_when_its_welfare_is_higher(path):
    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    clearing = clear_welfare(LEVELS, nodes, [bid("sprinter", 4, "9.00", hours=2),
                                             bid("marathon", 4, "2.00", hours=10)])
    assert winners(clearing) == ["sprinter"]


def test_a_cheap_nodes_gpus_are_sold_before_the_cheap_gpus_of_a_dear_node(path):
    # "dear" has one GPU at $1.00 and three at $3.00; "cheap" has four at $1.50. A 4-GPU
    # node bid takes the cheap node ($6.00 of reserves), not the dear one ($10.00).
    nodes = [offer("s1/l1/dear", "1.00", "3.00", "3.00", "3.00"),
             offer("s1/l1/cheap", "1.50", "1.50", "1.50", "1.50")]
    clearing = clear_welfare(LEVELS, nodes, [bid("job", 4, "4.00", required="node")])
    winner = clearing.market(H100).accepted[0]
    assert winner.assignment == {"cheap": 4}
    assert winner.reserves_micros == {"cheap": (1_500_000,) * 4}


def test_unconstrained_bids_take_the_cheapest_gpus_wherever_they_are(path):
    nodes = [offer("s1/l1/a", "1.00", "3.00"), offer("s1/l2/b", "1.20", "2.50")]
    clearing = clear_welfare(LEVELS, nodes, [bid("job", 2, "4.00")])
    assert clearing.market(H100).accepted[0].assignment == {"a": 1, "b": 1}


def test_a_gpu_above_the_limit_is_never_sold_to_that_bid():
    nodes = [offer("s1/l1/n1", "1.00", "5.00")]
    clearing = clear_welfare(LEVELS, nodes, [bid("job", 2, "4.00")])
    assert winners(clearing) == []
    loser = clearing.loser("job")
    assert loser.price_to_win_micros == micros("5.00")


def test_a_bid_that_fits_nowhere_has_no_price_to_win_and_says_why():
    nodes = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l2/n2", *["1.00"] * 4)]
    clearing = clear_welfare(LEVELS, nodes, [bid("wide", 6, "9.00", required="leaf")])
    loser = clearing.loser("wide")
    assert loser.price_to_win_micros is None
    assert "fits nowhere" in loser.reason and "leaf" in loser.reason


# --- the price -------------------------------------------------------------------------------


def test_every_winner_pays_one_price_at_or_below_its_limit_and_above_every_reserve_sold():
    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    clearing = clear_welfare(LEVELS, nodes, [bid("a", 2, "3.00"), bid("b", 2, "2.50"),
                                             bid("c", 2, "2.00")])
    market = clearing.market(H100)
    assert winners(clearing) == ["a", "b"]
    assert market.clearing_price_micros == micros("2.00")  # the highest refused limit
    assert {w.price_micros for w in market.accepted} == {micros("2.00")}


def test_the_price_never_exceeds_a_winners_limit():
    # the long, low bid wins over a short, high one: the price does not rise to the loser's
    # limit above the winner's
    nodes = [offer("s1/l1/n1", *["1.00"] * 4)]
    clearing = clear_welfare(LEVELS, nodes, [bid("sprinter", 4, "3.00", hours=1),
                                             bid("marathon", 4, "2.00", hours=10)])
    market = clearing.market(H100)
    assert market.clearing_price_micros == micros("1.00")
    assert market.accepted[0].price_micros <= micros("2.00")


# --- price to win ----------------------------------------------------------------------------


def _book():
    nodes = [offer("s1/l1/n1", "2.10", "2.10", "2.35"),
             offer("s1/l2/n2", "1.90", "1.90", "1.90", "1.90")]
    bids = [bid("wide", 4, "2.50", hours=4, required="leaf"), bid("long", 2, "2.40", hours=10),
            bid("node", 3, "2.60", hours=3, required="node"), bid("one", 1, "2.00")]
    return nodes, bids


def _with_limit(bids, bid_id, limit_micros):
    return [replace(b, limit_micros=limit_micros) if b.id == bid_id else b for b in bids]


def test_a_refused_bid_raised_to_its_price_to_win_wins_and_one_cent_below_does_not():
    nodes, bids = _book()
    clearing = clear_welfare(LEVELS, nodes, bids)
    refused = [loser for m in clearing.markets for loser in m.refused]
    assert refused
    for loser in refused:
        price = loser.price_to_win_micros
        assert price is not None, loser
        assert price % 10_000 == 0 and price > loser.bid.limit_micros
        raised = clear_welfare(LEVELS, nodes, _with_limit(bids, loser.bid.id, price),
                               price_to_win=False)
        assert loser.bid.id in winners(raised)
        below = clear_welfare(LEVELS, nodes, _with_limit(bids, loser.bid.id, price - 10_000),
                              price_to_win=False)
        assert loser.bid.id not in winners(below)


def test_price_to_win_holds_on_random_books():
    rng = random.Random(7)
    checked = 0
    for _ in range(6):
        nodes, bids = random_book(rng, nodes=rng.randint(3, 6), bids=rng.randint(3, 6))
        clearing = clear_welfare(LEVELS, nodes, bids)
        for loser in (loser for m in clearing.markets for loser in m.refused):
            if loser.price_to_win_micros is None:
                continue
            price = loser.price_to_win_micros
            raised = clear_welfare(LEVELS, nodes, _with_limit(bids, loser.bid.id, price),
                                   price_to_win=False)
            below = clear_welfare(LEVELS, nodes, _with_limit(bids, loser.bid.id, price - 10_000),
                                  price_to_win=False)
            assert loser.bid.id in winners(raised)
            # a cent below it cannot add welfare: it loses, or ties exactly (either may win)
            assert loser.bid.id not in winners(below) or below.welfare == clearing.welfare
            checked += 1
    assert checked >= 3


# --- alternatives ----------------------------------------------------------------------------


def test_a_bid_over_alternatives_wins_at_most_once_and_says_which():
    nodes = [offer("s1/l1/a", *["1.00"] * 8), offer("s1/l1/b", *["1.50"] * 8, model=H200)]
    either = AlternativeBid("either", (
        bid("either", 8, "2.00", hours=2, models=[H100]),
        bid("either", 8, "3.00", hours=2, models=[H200]),
    ))
    clearing = clear_welfare(LEVELS, nodes, [either])
    won = [w for m in clearing.markets for w in m.accepted]
    assert len(won) == 1
    # H200: (3.00 - 1.50) x 8 x 2 = $24 beats H100: (2.00 - 1.00) x 8 x 2 = $16
    assert won[0].alternative == 1 and won[0].shape.gpu_models == frozenset({H200})
    assert clearing.welfare == Decimal("24.00")


def test_an_alternative_loses_to_a_rival_and_the_other_alternative_wins():
    nodes = [offer("s1/l1/a", *["1.00"] * 8), offer("s1/l1/b", *["1.50"] * 8, model=H200)]
    either = AlternativeBid("either", (
        bid("either", 8, "2.00", hours=2, models=[H100]),
        bid("either", 8, "3.00", hours=2, models=[H200]),
    ))
    rival = bid("rival", 8, "5.00", hours=2, models=[H200])
    clearing = clear_welfare(LEVELS, nodes, [either, rival])
    assert winners(clearing) == ["either", "rival"]
    assert clearing.winner("either").alternative == 0
    assert clearing.winner("either").assignment == {"a": 8}


@pytest.mark.parametrize("count", [1, 9])
def test_alternatives_must_number_two_to_eight(count):
    with pytest.raises(InvalidInput) as error:
        AlternativeBid("x", tuple(bid("x", 1, "1.00", models=[H100]) for _ in range(count)))
    assert error.value.field == "bid x.alternatives"


def test_an_alternative_naming_no_market_is_refused_naming_the_field():
    with pytest.raises(InvalidInput) as error:
        AlternativeBid("x", (bid("x", 1, "1.00", models=[H100]), bid("x", 1, "1.00")))
    assert error.value.field == "bid x.alternatives[1].gpu_models"


# --- feasibility and the bound on random books ----------------------------------------------


def random_book(rng: random.Random, nodes: int, bids: int):
    offers = []
    for i in range(nodes):
        free = rng.randint(1, 8)
        base = 150 + 5 * rng.randint(0, 20)
        prices = [f"{(base + rng.randint(0, 30)) / 100:.2f}" for _ in range(free)]
        offers.append(offer(f"s{i // 4}/l{i // 2}/n{i}", *prices))
    orders = []
    for j in range(bids):
        draw = rng.random()
        if draw < 0.5:
            shape = bid(f"b{j}", rng.choice((1, 2, 4)), f"{rng.randint(150, 400) / 100:.2f}",
                        hours=rng.randint(1, 24), required=rng.choice((None, "node")))
        elif draw < 0.8:
            shape = bid(f"b{j}", rng.choice((4, 6, 8)), f"{rng.randint(150, 400) / 100:.2f}",
                        hours=rng.randint(1, 24), required="leaf")
        else:
            shape = bid(f"b{j}", 8, f"{rng.randint(150, 400) / 100:.2f}",
                        hours=rng.randint(1, 24), required="spine", slice_size=4)
        orders.append(shape)
    return offers, orders


def assert_feasible(clearing: WelfareClearing, nodes, levels=LEVELS):
    offers = {node.name: node for node in nodes}
    sold: dict[str, list[int]] = {}
    for market in clearing.markets:
        for winner in market.accepted:
            shape = winner.shape
            assert sum(winner.assignment.values()) == shape.gpus  # all or nothing
            for name, prices in winner.reserves_micros.items():
                assert len(prices) == winner.assignment[name]
                assert all(price <= shape.limit_micros for price in prices)
                assert offers[name].gpu_model == market.gpu_model
                sold.setdefault(name, []).extend(prices)
            if shape.topology.required is not None:
                domains = {domain_key(offers[name], levels, shape.topology.required)
                           for name in winner.assignment}
                assert len(domains) == 1, (winner.bid.id, domains)
            size = shape.topology.slice_size
            if size:
                per_node: dict = {}
                for name, gpus in winner.assignment.items():
                    key = domain_key(offers[name], levels, shape.topology.slice_level or "node")
                    per_node[key] = per_node.get(key, 0) + gpus
                assert all(gpus % size == 0 for gpus in per_node.values())
            assert winner.price_micros <= shape.limit_micros
    for name, prices in sold.items():
        # no GPU sold twice: what was sold on a node is part of its reserves, counted
        remaining = list(offers[name].reserve_micros)
        for price in prices:
            remaining.remove(price)


def test_the_clearing_is_feasible_and_its_bound_holds_on_random_books():
    rng = random.Random(11)
    for _ in range(12):
        nodes, bids = random_book(rng, nodes=rng.randint(4, 12), bids=rng.randint(4, 14))
        clearing = clear_welfare(LEVELS, nodes, bids, time_limit_s=60, price_to_win=False)
        assert_feasible(clearing, nodes)
        exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
        assert exact.optimal
        assert clearing.welfare_bound >= exact.welfare
        assert clearing.welfare == exact.welfare  # small books are solved to optimality
        assert clearing.optimal


def test_big_books_are_cleared_by_decomposition_with_a_valid_bound(monkeypatch):
    # force the decomposition on a book small enough to prove its optimum
    import market.core.winners as module

    monkeypatch.setattr(module, "MIP_MAX_COLUMNS", 0)
    rng = random.Random(3)
    for _ in range(5):
        nodes, bids = random_book(rng, nodes=10, bids=12)
        clearing = clear_welfare(LEVELS, nodes, bids, time_limit_s=2.0)
        assert_feasible(clearing, nodes)
        exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
        assert clearing.welfare <= exact.welfare <= clearing.welfare_bound
        assert not clearing.optimal
        assert Decimal(0) <= clearing.gap < 1
        for loser in (loser for m in clearing.markets for loser in m.refused):
            assert loser.price_to_win_micros is None or loser.price_to_win_reason


def test_a_budget_cut_short_reports_not_optimal_with_a_valid_bound():
    rng = random.Random(5)
    nodes, bids = random_book(rng, nodes=24, bids=30)
    clearing = clear_welfare(LEVELS, nodes, bids, time_limit_s=0.05, price_to_win=False)
    assert_feasible(clearing, nodes)
    exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
    assert exact.optimal
    assert clearing.welfare <= exact.welfare <= clearing.welfare_bound
    if not clearing.optimal:
        assert clearing.welfare_bound >= clearing.welfare


@pytest.mark.parametrize("decomposed", [False, True])
def test_alternatives_across_markets_win_at_most_once_and_stay_feasible(monkeypatch, decomposed):
    import market.core.winners as module

    if decomposed:
        monkeypatch.setattr(module, "MIP_MAX_COLUMNS", 0)
    rng = random.Random(17)
    for _ in range(4):
        h100, shapes = random_book(rng, nodes=6, bids=10)
        h200 = [replace(node, name=f"x{node.name}", gpu_model=H200) for node in h100[:3]]
        orders = []
        for shape in shapes:
            if rng.random() < 0.5:
                orders.append(replace(shape, gpu_models=frozenset({H100})))
                continue
            other = replace(shape, gpu_models=frozenset({H200}),
                            limit_micros=shape.limit_micros + 10_000 * rng.randint(0, 50))
            orders.append(AlternativeBid(shape.id, (replace(shape, gpu_models=frozenset({H100})),
                                                    other)))
        clearing = clear_welfare(LEVELS, h100 + h200, orders, time_limit_s=2.0)
        assert_feasible(clearing, h100 + h200)
        won = [w.bid.id for m in clearing.markets for w in m.accepted]
        assert len(won) == len(set(won))
        refused = {loser.bid.id for m in clearing.markets for loser in m.refused}
        assert refused | set(won) == {order.id for order in orders}
        assert not refused & set(won)
        for winner in (w for m in clearing.markets for w in m.accepted):
            assert winner.shape == [*(winner.bid.alternatives if isinstance(
                winner.bid, AlternativeBid) else (winner.bid,))][winner.alternative]
        assert clearing.welfare <= clearing.welfare_bound


# --- the incumbent at scale ---------------------------------------------------------------


def test_what_breaking_a_whole_node_counts_decides_where_a_bid_free_to_move_goes():
    from market.core.winners import options_of
    from market.core.winners_search import WHOLE_NODE_WIDE_MICROS, greedy

    # a whole node $2.50 cheaper than a partial one: broken at $1 more, kept whole at $5
    nodes = [offer("s1/l1/whole", *["1.00"] * 4), offer("s1/l1/part", "3.50", "3.50")]
    options = options_of([bid("b", 1, "4.00")], [H100])
    by_market = {H100: nodes}
    assert list(greedy(LEVELS, by_market, options, [0])[0].assignment) == ["whole"]
    wide = greedy(LEVELS, by_market, options, [0], whole_node_micros=WHOLE_NODE_WIDE_MICROS)
    assert list(wide[0].assignment) == ["part"]


def test_a_spine_bid_takes_whole_nodes_from_the_leaf_of_least_room_so_a_leaf_bid_still_fits():
    from market.core.winners import options_of
    from market.core.winners_search import ROOM_MICROS, greedy

    # leaf l1: two cheap whole nodes and two GPUs more (room 10); leaf l2: two dearer whole
    # nodes (room 8). The spine bid needs two whole nodes, the leaf bid 10 GPUs of one leaf
    nodes = [offer("s1/l1/a", *["1.00"] * 4), offer("s1/l1/b", *["1.00"] * 4),
             offer("s1/l1/c", "1.00", "1.00"),
             offer("s1/l2/d", *["1.50"] * 4), offer("s1/l2/e", *["1.50"] * 4)]
    options = options_of([bid("spine", 8, "4.00", required="spine", slice_size=4),
                          bid("leaf", 10, "4.00", required="leaf")], [H100])
    by_market = {H100: nodes}

    cheapest_first = greedy(LEVELS, by_market, options, [0, 1])
    assert [sorted(sale.assignment) for sale in cheapest_first] == [["a", "b"]]

    roomiest_kept = greedy(LEVELS, by_market, options, [0, 1], room_micros=ROOM_MICROS)
    assert [sorted(sale.assignment) for sale in roomiest_kept] == [["d", "e"], ["a", "b", "c"]]


def test_the_domains_that_could_hold_a_shape_are_counted_with_nothing_sold():
    from market.core.winners import options_of
    from market.core.winners_search import domains_holding

    # s1: leaf l1 of four whole nodes (16 GPUs), leaf l2 of one node and a half-sold one;
    # s2: two whole nodes
    nodes = [*(offer(f"s1/l1/a{i}", *["1.00"] * 4) for i in range(4)),
             offer("s1/l2/b", *["1.00"] * 4), offer("s1/l2/c", "1.00", "1.00"),
             offer("s2/l3/d", *["1.50"] * 4), offer("s2/l3/e", *["1.50"] * 4)]
    options = options_of([bid("leaf16", 16, "4.00", required="leaf"),
                          bid("leaf6", 6, "4.00", required="leaf"),
                          bid("spine20", 20, "4.00", required="spine", slice_size=4),
                          bid("spine22", 22, "4.00", required="spine"),
                          bid("spine24", 24, "4.00", required="spine", slice_size=4)], [H100])

    holding = domains_holding(LEVELS, {H100: nodes}, options, range(len(options)))

    # 16 GPUs: l1 only; 6: l1 and l2 (4 + 2), and l3; 20 in whole nodes: s1 (5 whole nodes);
    # 22 GPUs one by one: s1 (22); 24 in whole nodes: none (s1 has 5 whole nodes, not 6)
    assert [holding[i] for i in range(len(options))] == [1, 3, 1, 1, 0]


def test_a_leaf_bid_few_leaves_can_hold_is_seated_before_a_spine_bid_breaks_its_leaf():
    from market.core.winners import options_of, seating_order
    from market.core.winners_search import ROOM_MICROS, greedy

    # s1: leaf l1, four cheap whole nodes, the only leaf that holds 16 GPUs; leaf l2, one
    # more. s2: three dear whole nodes. The spine bid fits in either spine; seated first, it
    # takes s1's l2 node (least room) and one of l1's, and the leaf bid is left without a leaf
    nodes = [*(offer(f"s1/l1/a{i}", *["1.00"] * 4) for i in range(4)),
             offer("s1/l2/b", *["1.00"] * 4),
             *(offer(f"s2/l3/{name}", *["3.00"] * 4) for name in "def")]
    options = options_of([bid("spine", 8, "4.50", required="spine", slice_size=4),
                          bid("leaf", 16, "4.00", required="leaf")], [H100])
    by_market = {H100: nodes}

    widest_first = greedy(LEVELS, by_market, options, [0, 1], room_micros=ROOM_MICROS)
    assert [options[sale.option].shape.id for sale in widest_first] == ["spine"]
    assert sorted(widest_first[0].assignment) == ["a0", "b"]

    order = seating_order(LEVELS, by_market, options, {0, 1}, [0, 1])
    assert order == [1, 0]  # the leaf bid: one leaf holds it; the spine bid: two spines
    scarcest_first = greedy(LEVELS, by_market, options, order, room_micros=ROOM_MICROS)
    assert [(options[sale.option].shape.id, sorted(sale.assignment))
            for sale in scarcest_first] == [("leaf", ["a0", "a1", "a2", "a3"]),
                                            ("spine", ["d", "e"])]


def test_a_clearing_seats_a_leaf_bid_only_one_leaf_holds_beside_a_spine_bid(monkeypatch):
    import market.core.winners as module

    monkeypatch.setattr(module, "MIP_MAX_COLUMNS", 0)  # as if the book were too big
    nodes = [*(offer(f"s1/l1/a{i}", *["1.00"] * 4) for i in range(4)),
             offer("s1/l2/b", *["1.00"] * 4),
             *(offer(f"s2/l3/{name}", *["3.00"] * 4) for name in "def")]
    bids = [bid("leaf", 16, "4.00", required="leaf"),
            bid("spine", 8, "4.50", required="spine", slice_size=4)]

    clearing = clear_welfare(LEVELS, nodes, bids, time_limit_s=1.0, price_to_win=False)

    assert_feasible(clearing, nodes)
    assert winners(clearing) == ["leaf", "spine"]
    assert sorted(clearing.winner("spine").assignment) == ["d", "e"]
    assert clearing.welfare == Decimal("60.00")  # 16 x $3 + 8 x $1.50: the optimum


def test_a_leaf_pick_the_seating_pass_lost_is_tried_seated_first(monkeypatch):
    import market.core.winners as module

    monkeypatch.setattr(module, "MIP_MAX_COLUMNS", 0)  # as if the book were too big
    # one spine of seven whole nodes; the spine bid needs five, the leaf bid 9 GPUs of a
    # leaf: l1 holds it only whole (two whole nodes and a node of 2 GPUs), l2 only whole (three
    # whole nodes). The spine bid, scarcer (one spine holds it), is seated first and takes the
    # nodes of least room: l3's two, l1's two, then one of l2's, and the leaf bid fits nowhere.
    # Seated first, the leaf bid takes l1, and the spine bid l3's and l2's nodes
    nodes = [offer("s1/l1/a1", *["1.00"] * 4), offer("s1/l1/a2", *["1.00"] * 4),
             offer("s1/l1/a3", "1.00", "1.00"),
             *(offer(f"s1/l2/b{i}", *["1.00"] * 4) for i in range(3)),
             *(offer(f"s1/l3/c{i}", *["1.00"] * 4) for i in range(2))]
    bids = [bid("spine", 20, "4.50", hours=10, required="spine", slice_size=4),
            bid("leaf", 9, "4.00", hours=10, required="leaf")]

    clearing = clear_welfare(LEVELS, nodes, bids, time_limit_s=1.0, price_to_win=False)

    assert_feasible(clearing, nodes)
    assert winners(clearing) == ["leaf", "spine"]
    assert sorted(clearing.winner("leaf").assignment) == ["a1", "a2", "a3"]
    assert clearing.welfare == solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S).welfare


def test_a_bid_free_to_go_anywhere_fills_the_tight_leaf_so_a_leaf_bid_still_fits():
    from market.core.winners import options_of
    from market.core.winners_search import GPU_ROOM_MICROS, greedy

    # leaf l2's eight GPUs are a cent cheaper than l1's four; the leaf bid needs all eight
    nodes = [offer("s1/l1/a", *["1.00"] * 4),
             offer("s1/l2/b", *["0.99"] * 4), offer("s1/l2/c", *["0.99"] * 4)]
    options = options_of([bid("anywhere", 4, "4.00"), bid("leaf", 8, "4.00", required="leaf")],
                         [H100])
    by_market = {H100: nodes}

    cheapest_first = greedy(LEVELS, by_market, options, [0, 1])
    assert [sorted(sale.assignment) for sale in cheapest_first] == [["b"]]

    tight_first = greedy(LEVELS, by_market, options, [0, 1], gpu_room_micros=GPU_ROOM_MICROS)
    assert [sorted(sale.assignment) for sale in tight_first] == [["a"], ["b", "c"]]


def test_redealing_gives_the_longest_bids_the_cheapest_gpus_and_never_loses_welfare():
    from market.core.winners import _welfare_of, options_of, value_order
    from market.core.winners_search import greedy, redeal

    rng = random.Random(23)
    for _ in range(20):
        nodes, bids = random_book(rng, nodes=rng.randint(4, 16), bids=rng.randint(6, 20))
        by_market = {H100: nodes}
        offers = {node.name: node for node in nodes}
        options = options_of(bids, [H100])
        sales = greedy(LEVELS, by_market, options, value_order(options, by_market))
        dealt = redeal(LEVELS, by_market, options, sales)
        assert [sale.option for sale in dealt] == [sale.option for sale in sales]
        assert _welfare_of(options, dealt) >= _welfare_of(options, sales)
        sold_before, sold_after = [], []
        for before, after in zip(sales, dealt, strict=True):
            shape = options[after.option].shape
            assert sum(after.assignment.values()) == shape.gpus
            assert all(p <= shape.limit_micros for ps in after.reserves_micros.values() for p in ps)
            if shape.topology.required is not None:
                assert len({domain_key(offers[name], LEVELS, shape.topology.required)
                            for name in after.assignment}) == 1
            if shape.topology.slice_size:  # slices keep whole placements, maybe another's
                assert after.assignment in [sale.assignment for sale in sales]
            sold_before += [(n, p) for n, ps in before.reserves_micros.items() for p in ps]
            sold_after += [(n, p) for n, ps in after.reserves_micros.items() for p in ps]
        assert sorted(sold_before) == sorted(sold_after)  # the same GPUs, dealt again


def test_two_unconstrained_winners_swap_gpus_so_the_longer_one_pays_less():
    from market.core.winners import _welfare_of, options_of
    from market.core.winners_search import Sale, redeal

    nodes = [offer("s1/l1/n1", "1.50"), offer("s1/l1/n2", "2.50")]
    bids = [bid("short", 1, "3.00", hours=1), bid("long", 1, "3.00", hours=10)]
    options = options_of(bids, [H100])
    sales = [Sale(0, {"n1": 1}, {"n1": (micros("1.50"),)}),
             Sale(1, {"n2": 1}, {"n2": (micros("2.50"),)})]
    dealt = redeal(LEVELS, {H100: nodes}, options, sales)
    assert dealt[1].assignment == {"n1": 1} and dealt[0].assignment == {"n2": 1}
    assert _welfare_of(options, dealt) - _welfare_of(options, sales) == 9 * micros("1.00")


@pytest.mark.parametrize(("short_limit", "swapped"), [("3.00", True), ("2.00", False)])
def test_a_long_leaf_bid_takes_the_cheaper_leaf_of_a_shorter_one_it_may_take(short_limit,
                                                                              swapped):
    from market.core.winners import _welfare_of, options_of
    from market.core.winners_search import Sale, redeal

    nodes = [offer("s1/l1/n1", *["1.50"] * 4), offer("s1/l2/n2", *["2.50"] * 4)]
    bids = [bid("short", 4, short_limit, hours=1, required="leaf"),
            bid("long", 4, "3.00", hours=10, required="leaf")]
    options = options_of(bids, [H100])
    sales = [Sale(0, {"n1": 4}, {"n1": (micros("1.50"),) * 4}),
             Sale(1, {"n2": 4}, {"n2": (micros("2.50"),) * 4})]
    dealt = redeal(LEVELS, {H100: nodes}, options, sales)
    if swapped:  # 10 h x 4 GPUs $1.00 cheaper, 1 h x 4 GPUs $1.00 dearer
        assert dealt[1].assignment == {"n1": 4} and dealt[0].assignment == {"n2": 4}
        assert _welfare_of(options, dealt) - _welfare_of(options, sales) == 36 * micros("1.00")
    else:  # the short bid may not take GPUs reserved at $2.50 above its $2.00
        assert [sale.assignment for sale in dealt] == [{"n1": 4}, {"n2": 4}]


@pytest.mark.parametrize("required", ["spine", "node"])
def test_a_long_bid_held_on_its_node_takes_the_cheaper_node_a_shorter_bid_sold(required):
    from market.core.winners import _welfare_of, options_of
    from market.core.winners_search import Sale, redeal

    # a spine bid's whole-node slice and a `node` bid never leave their node in the pools;
    # the two nodes, of two leaves, have as many free GPUs: what they sold changes nodes
    nodes = [offer("s1/l1/a", *["1.00"] * 4), offer("s1/l2/b", *["2.00"] * 4)]
    long_bid = bid("long", 4, "3.00", hours=10, required=required,
                   slice_size=4 if required == "spine" else None)
    options = options_of([long_bid, bid("short", 4, "3.00", hours=1)], [H100])
    sales = [Sale(0, {"b": 4}, {"b": (micros("2.00"),) * 4}),
             Sale(1, {"a": 4}, {"a": (micros("1.00"),) * 4})]

    dealt = redeal(LEVELS, {H100: nodes}, options, sales)

    assert [sale.assignment for sale in dealt] == [{"a": 4}, {"b": 4}]
    # 10 h x 4 GPUs $1.00 cheaper, 1 h x 4 GPUs $1.00 dearer
    assert _welfare_of(options, dealt) - _welfare_of(options, sales) == 36 * micros("1.00")


@pytest.mark.parametrize("blocker", ["leaf bid", "limit", "runtime", "free GPUs", "spine"])
def test_two_nodes_exchange_what_they_sold_only_where_every_bid_may_sit_on_the_other(blocker):
    from market.core.winners import options_of
    from market.core.winners_search import Sale, redeal

    spine_b = "s2" if blocker == "spine" else "s1"  # nodes are paired within one spine
    nodes = [offer("s1/l1/a", *["1.00"] * 4),
             offer(f"{spine_b}/l2/b", *["2.00"] * (5 if blocker == "free GPUs" else 4))]
    long_bid = bid("long", 4, "3.00", hours=10, required="node")
    short_bid = bid("short", 4, "1.50" if blocker == "limit" else "3.00", hours=1,
                    required="leaf" if blocker == "leaf bid" else None)
    if blocker == "runtime":
        nodes[0] = replace(nodes[0], runtime="slurm")
        long_bid = replace(long_bid, runtimes=frozenset({"none"}))
    options = options_of([long_bid, short_bid], [H100])
    sales = [Sale(0, {"b": 4}, {"b": (micros("2.00"),) * 4}),
             Sale(1, {"a": 4}, {"a": (micros("1.00"),) * 4})]

    dealt = redeal(LEVELS, {H100: nodes}, options, sales)

    # the short bid may not leave leaf l1, nor pay $2.00 above its $1.50; the long one may
    # not run on a's runtime; b has a GPU more than a; the nodes are in two spines
    assert [sale.assignment for sale in dealt] == [{"b": 4}, {"a": 4}]


def test_a_domain_holds_the_largest_sum_of_bid_sizes_within_its_free_gpus():
    from market.core.winners_solver import most_packed

    assert most_packed(304, [128, 256]) == 256  # a spine of 38 free nodes: 2 x 128 or 256
    assert most_packed(50, [16, 24]) == 48
    assert most_packed(7, [3, 5]) == 6
    assert most_packed(15, [16]) == 0


@pytest.mark.parametrize("whole_share", [0.0, 0.5, 1.0])
def test_the_lagrangian_bound_holds_the_proven_optimum_on_random_books(whole_share):
    # 0: tiers pooled only; 1: leaf and spine bids priced whole from the first step
    import time

    from market.core.winners import _fits_alone, options_of
    from market.core.winners_solver import lagrangian_bound

    rng = random.Random(29)
    for _ in range(15):
        nodes, bids = random_book(rng, nodes=rng.randint(4, 14), bids=rng.randint(6, 16))
        by_market = {H100: nodes}
        options = options_of(bids, [H100])
        bound = lagrangian_bound(LEVELS, by_market, options,
                                 _fits_alone(LEVELS, by_market, options),
                                 time.perf_counter() + 0.5, incumbent=0.0,
                                 whole_share=whole_share)[0]
        exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
        assert exact.optimal
        assert bound * (1 + 1e-9) + 1e-6 >= float(exact.welfare)


# --- leaf and spine bids priced whole -------------------------------------------------------


def two_leaves_of_cheap_and_dear_gpus():
    # each leaf: a node of two $1.00 GPUs and a node of two $3.00 GPUs
    return [offer("s1/l1/a1", "1.00", "1.00"), offer("s1/l1/a2", "3.00", "3.00"),
            offer("s1/l2/b1", "1.00", "1.00"), offer("s1/l2/b2", "3.00", "3.00")]


def test_a_leaf_bid_is_priced_by_its_best_whole_leaf_not_the_cheapest_gpus_anywhere():
    import numpy as np

    from market.core.winners_domains import domain_groups, whole_gains
    from market.core.winners_solver import GRID

    nodes = two_leaves_of_cheap_and_dear_gpus()
    tiers = {(micros("1.00"), 2): 0, (micros("3.00"), 2): 1}
    groups = domain_groups(LEVELS, nodes, "leaf", tiers, GRID)
    pi = np.array([5.0, 0.0])  # a $5 shadow price on each cheap GPU
    gain, (bids, tier, gpus), where = whole_gains(groups, pi, np.array([10.0]),
                                                  np.array([float(micros("4.00"))]),
                                                  np.array([4.0]), np.array([1]))
    # one leaf: 10 h x ($3 + $3 on the cheap GPUs, $1 + $1 on the dear) - 2 x $5 = $70; the
    # pooled relaxation would give it four cheap GPUs: 4 x ($30 - $5) = $100
    assert gain[0] == pytest.approx(70.0)
    assert sorted(zip(tier.tolist(), gpus.tolist(), strict=True)) == [(0, 2.0), (1, 2.0)]
    assert where[0] == 0  # the first leaf (the two are alike)


def test_a_price_on_a_crowded_leaf_sends_its_bid_to_the_other_leaf():
    import numpy as np

    from market.core.winners_domains import domain_groups, whole_gains
    from market.core.winners_solver import GRID

    nodes = two_leaves_of_cheap_and_dear_gpus()
    tiers = {(micros("1.00"), 2): 0, (micros("3.00"), 2): 1}
    groups = domain_groups(LEVELS, nodes, "leaf", tiers, GRID)
    gain, _, where = whole_gains(groups, np.zeros(2), np.array([10.0]),
                                 np.array([float(micros("4.00"))]), np.array([4.0]),
                                 np.array([1]), rho=np.array([2.0, 0.5]))
    # $80 in either leaf, less $2 or $0.50 a GPU for its row: the second leaf, $78
    assert where[0] == 1
    assert gain[0] == pytest.approx(78.0)


def test_a_domain_row_holds_what_its_bids_can_take_there():
    from market.core.winners_domains import domain_capacities

    nodes = [offer("s1/l1/a1", *["1.00"] * 8), offer("s1/l1/a2", *["1.00"] * 7),
             offer("s1/l2/b1", *["1.00"] * 8), offer("s1/l2/b2", *["1.00"] * 8)]
    spine = [bid("s", 8, "3.00", required="spine", slice_size=8)]
    leaf = [bid("a", 6, "3.00", required="leaf"), bid("b", 4, "3.00", required="leaf")]
    # in whole nodes of 8: the 7-GPU node gives none
    assert domain_capacities(LEVELS, nodes, "spine", spine).tolist() == [24.0]
    # every free GPU, then the largest sum of sizes 4 and 6 within it: 15 -> 14, 16 -> 16
    assert domain_capacities(LEVELS, nodes, "leaf", leaf).tolist() == [14.0, 16.0]


def test_the_bound_with_crowded_leaves_holds_the_proven_optimum_on_random_books():
    # many leaf and spine bids for few domains: the rows that price each domain bind
    import time

    from market.core.winners import _fits_alone, options_of
    from market.core.winners_solver import lagrangian_bound

    rng = random.Random(31)
    for _ in range(12):
        nodes, bids = random_book(rng, nodes=rng.randint(6, 12), bids=rng.randint(16, 28))
        by_market = {H100: nodes}
        options = options_of(bids, [H100])
        bound = lagrangian_bound(LEVELS, by_market, options,
                                 _fits_alone(LEVELS, by_market, options),
                                 time.perf_counter() + 0.5, incumbent=0.0, whole_share=1.0)[0]
        exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
        assert exact.optimal
        assert bound * (1 + 1e-9) + 1e-6 >= float(exact.welfare)


def test_pricing_leaf_bids_whole_lowers_the_bound_and_it_still_holds_the_optimum():
    import time

    from market.core.winners import _fits_alone, options_of
    from market.core.winners_solver import lagrangian_bound

    nodes = two_leaves_of_cheap_and_dear_gpus()
    bids = [bid("leaf", 4, "4.00", hours=10, required="leaf"), bid("any", 2, "3.50")]
    by_market = {H100: nodes}
    options = options_of(bids, [H100])
    usable = _fits_alone(LEVELS, by_market, options)

    def bound(whole_share):
        return lagrangian_bound(LEVELS, by_market, options, usable, time.perf_counter() + 0.5,
                                incumbent=0.0, whole_share=whole_share)[0]

    exact = solve_exact(LEVELS, nodes, bids, time_limit_s=EXACT_S)
    assert exact.welfare == Decimal("85.00")  # the leaf bid in one leaf, the other's $1 pair
    assert float(exact.welfare) <= bound(0.5) < bound(0.0) - 10


def test_a_bid_priced_whole_gets_its_best_domain_as_a_brute_force_finds_it():
    # bids whose limit clears every reserve share running totals; the others are dealt one by
    # one: both against every GPU of every domain, one at a time
    import numpy as np

    from market.core.winners_domains import domain_groups, whole_gains
    from market.core.winners_solver import GRID

    rng = random.Random(37)
    for _ in range(20):
        nodes = [offer(f"s{i // 4}/l{i // 2}/n{i}",
                       *[f"{rng.randint(100, 300) / 100:.2f}" for _ in range(rng.randint(1, 8))])
                 for i in range(rng.randint(2, 12))]
        tiers = {}
        for node in nodes:
            for price in node.reserve_micros:
                tiers.setdefault((price // GRID * GRID, node.free_gpus), len(tiers))
        level = rng.choice(("leaf", "spine"))
        groups = domain_groups(LEVELS, nodes, level, tiers, GRID)
        count = 12
        hours = np.array([float(rng.randint(1, 3)) for _ in range(count)])
        limit = np.array([float(rng.randint(100, 320) * 10_000) for _ in range(count)])
        gpus = np.array([float(rng.choice((1, 2, 4, 6, 8))) for _ in range(count)])
        need = np.array([rng.choice((1, 1, 4)) for _ in range(count)])
        pi = np.array([rng.random() * 3 for _ in tiers])
        domains = {}
        for node in nodes:
            domains.setdefault(domain_key(node, LEVELS, level), []).append(node)
        rho = np.array([rng.random() for _ in domains])
        gain, _, where = whole_gains(groups, pi, hours, limit, gpus, need, rho)
        for b in range(count):
            best = -np.inf
            for d, members in enumerate(domains.values()):
                costs = sorted(hours[b] * price / 1e6 + pi[tiers[(price // GRID * GRID,
                                                                  node.free_gpus)]]
                               for node in members if node.free_gpus >= need[b]
                               for price in node.reserve_micros if price <= limit[b])
                if len(costs) >= gpus[b]:
                    taken = costs[:int(gpus[b])]
                    best = max(best, sum(hours[b] * limit[b] / 1e6 - c for c in taken)
                               - rho[d] * gpus[b])
            assert gain[b] == pytest.approx(best, abs=1e-6) if np.isfinite(best) else (
                not np.isfinite(gain[b]) and where[b] == -1)

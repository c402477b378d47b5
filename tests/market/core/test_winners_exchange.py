"""Exchanges (`market.core.winners_exchange`): a losing leaf bid wins in place of small winners,
which go elsewhere; on random books every answer stays feasible and welfare never falls."""

from __future__ import annotations

import random
from collections import Counter
from decimal import Decimal

from market.core.clearing import Bid, NodeOffer, Topology, domain_key, micros
from market.core.winners import options_of, value_order
from market.core.winners_exchange import exchanges
from market.core.winners_search import Sale, greedy, redeal

LEVELS = ("spine", "leaf", "node")
H100 = "H100"


def offer(path: str, *prices: str) -> NodeOffer:
    spine, leaf, name = path.split("/")
    return NodeOffer(name, {"spine": spine, "leaf": leaf}, H100,
                     tuple(micros(price) for price in prices))


def bid(bid_id, gpus, limit, hours=1, required=None, slice_size=None) -> Bid:
    return Bid(id=bid_id, gpus=gpus, hours=Decimal(hours), limit_micros=micros(limit),
               topology=Topology(required=required, slice_size=slice_size))


def welfare(options, sales) -> Decimal:
    return sum((options[s.option].shape.hours
                * sum(options[s.option].shape.limit_micros - p
                      for prices in s.reserves_micros.values() for p in prices)
                for s in sales), Decimal(0))


def assert_feasible(nodes, options, sales) -> None:
    offers = {node.name: node for node in nodes}
    orders = Counter(options[sale.option].order for sale in sales)
    assert all(count == 1 for count in orders.values())  # one alternative at most
    sold: dict[str, list[int]] = {}
    for sale in sales:
        shape = options[sale.option].shape
        assert sum(sale.assignment.values()) == shape.gpus  # all or nothing
        for name, prices in sale.reserves_micros.items():
            assert len(prices) == sale.assignment[name]
            assert all(price <= shape.limit_micros for price in prices)
            sold.setdefault(name, []).extend(prices)
        if shape.topology.required is not None:
            assert len({domain_key(offers[name], LEVELS, shape.topology.required)
                        for name in sale.assignment}) == 1
        if shape.topology.slice_size:
            per_node = Counter()
            for name, gpus in sale.assignment.items():
                per_node[domain_key(offers[name], LEVELS, "node")] += gpus
            assert all(gpus % shape.topology.slice_size == 0 for gpus in per_node.values())
    for name, prices in sold.items():  # each GPU sold once
        remaining = list(offers[name].reserve_micros)
        for price in prices:
            remaining.remove(price)


def test_a_leaf_bid_wins_in_place_of_small_winners_that_move_to_another_leaf():
    # leaf l1 holds 8 GPUs, two node bids of 2 sit there, one on each node: the leaf bid of 8
    # ($2 x 8 GPUs x 10 h = $160) does not fit. Evicted, the node bids fit on n3 in leaf l2.
    nodes = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l1/n2", *["1.00"] * 4),
             offer("s1/l2/n3", *["1.00"] * 4)]
    bids = [bid("small-a", 2, "3.00", required="node"), bid("small-b", 2, "3.00", required="node"),
            bid("leaf-8", 8, "3.00", hours=10, required="leaf")]
    options = options_of(bids, [H100])
    two = (micros("1.00"),) * 2
    incumbent = [Sale(0, {"n1": 2}, {"n1": two}), Sale(1, {"n2": 2}, {"n2": two})]

    result = exchanges(LEVELS, {H100: nodes}, options, incumbent, [2, 0, 1])

    assert_feasible(nodes, options, result)
    assert sorted(bids[options[s.option].order].id for s in result) == [
        "leaf-8", "small-a", "small-b"]
    assert welfare(options, result) == micros("168.00")


def test_an_exchange_that_loses_welfare_is_undone():
    # the same, but the node bids are worth more than the leaf bid and have nowhere to go
    nodes = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l1/n2", *["1.00"] * 4)]
    bids = [bid("small-a", 2, "3.00", hours=20, required="node"),
            bid("small-b", 2, "3.00", hours=20, required="node"),
            bid("leaf-8", 8, "3.00", hours=1, required="leaf")]
    options = options_of(bids, [H100])
    two = (micros("1.00"),) * 2
    incumbent = [Sale(0, {"n1": 2}, {"n1": two}), Sale(1, {"n2": 2}, {"n2": two})]

    result = exchanges(LEVELS, {H100: nodes}, options, incumbent, [2, 0, 1])

    assert sorted((s.option, dict(s.reserves_micros)) for s in result) == sorted(
        (s.option, dict(s.reserves_micros)) for s in incumbent)


def random_book(rng: random.Random, nodes: int, bids: int):
    offers = []
    for i in range(nodes):
        base = 150 + 5 * rng.randint(0, 20)
        prices = [f"{(base + rng.randint(0, 30)) / 100:.2f}" for _ in range(rng.randint(1, 8))]
        offers.append(offer(f"s{i // 8}/l{i // 4}/n{i}", *prices))
    orders = []
    for j in range(bids):
        limit, hours = f"{rng.randint(150, 400) / 100:.2f}", rng.randint(1, 24)
        draw = rng.random()
        if draw < 0.6:
            orders.append(bid(f"b{j}", rng.choice((1, 2, 4)), limit, hours,
                              required=rng.choice((None, "node"))))
        elif draw < 0.9:
            orders.append(bid(f"b{j}", rng.choice((6, 8, 12, 16)), limit, hours,
                              required=rng.choice(("leaf", "spine"))))
        else:
            orders.append(bid(f"b{j}", 8, limit, hours, required="spine", slice_size=4))
    return offers, orders


def test_exchanges_keep_every_constraint_and_never_lose_welfare_on_random_books():
    rng = random.Random(24)
    rose = 0
    for _ in range(40):
        nodes, bids = random_book(rng, nodes=rng.randint(8, 32), bids=rng.randint(10, 60))
        options = options_of(bids, [H100])
        order = value_order(options, {H100: nodes})
        incumbent = redeal(LEVELS, {H100: nodes}, options,
                           greedy(LEVELS, {H100: nodes}, options, order))

        result = exchanges(LEVELS, {H100: nodes}, options, incumbent, order)

        assert_feasible(nodes, options, result)
        assert welfare(options, result) >= welfare(options, incumbent)
        rose += welfare(options, result) > welfare(options, incumbent)
    assert rose  # the books do hold exchanges that pay


def test_gpus_a_chain_leaves_free_go_to_the_next_loser_by_value():
    # the leaf bid of 4 ($3 x 4) frees the cheapest domain: it evicts the unconstrained bid
    # of 8 ($0.30 x 8) from n2, which fits nowhere else; its other 4 GPUs go to the loser
    # of 4 GPUs that can take them ($1 x 4), not left idle
    nodes = [offer("s1/l1/n1", *["1.00"] * 4), offer("s1/l2/n2", *["1.00"] * 8)]
    bids = [bid("node-4", 4, "3.50", required="node"), bid("anywhere-8", 8, "1.30"),
            bid("leaf-4", 4, "4.00", required="leaf"), bid("anywhere-4", 4, "2.00")]
    options = options_of(bids, [H100])
    incumbent = [Sale(0, {"n1": 4}, {"n1": (micros("1.00"),) * 4}),
                 Sale(1, {"n2": 8}, {"n2": (micros("1.00"),) * 8})]

    result = exchanges(LEVELS, {H100: nodes}, options, incumbent, [2, 0, 3, 1])

    assert_feasible(nodes, options, result)
    assert {bids[options[s.option].order].id: s.assignment for s in result} == {
        "node-4": {"n1": 4}, "leaf-4": {"n2": 4}, "anywhere-4": {"n2": 4}}
    assert welfare(options, result) == micros("26.00")  # against $12.40 before

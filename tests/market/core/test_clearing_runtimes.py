"""A bid asking nodes to run something (a workload, SSH keys) is matched only to nodes whose
runtime can run it, in auctions, on demand and in the exact solve; bids asking nothing clear as
before."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from market.core.clearing import (
    Bid,
    NodeOffer,
    clear_auction,
    match_on_demand,
    micros,
    solve_exact,
)
from pool.core.workloads import RUNS_COMMANDS, RUNS_SSH
from tests.market.core.test_clearing import H100, LEVELS, DomainPlacer, offer


def on(runtime: str, node: NodeOffer) -> NodeOffer:
    return dataclasses.replace(node, runtime=runtime)


def bid(bid_id, gpus, limit, runtimes=None) -> Bid:
    return Bid(id=bid_id, gpus=gpus, hours=Decimal(1), limit_micros=micros(limit),
               runtimes=runtimes)


def test_an_auction_bid_with_a_workload_is_not_matched_to_nodes_running_nothing():
    nodes = [offer("s1/l1/n1", "1.00", "1.00"), on("process", offer("s1/l1/n2", "2.00", "2.00"))]
    market = clear_auction(LEVELS, nodes, [bid("work", 2, "3.00", RUNS_COMMANDS)],
                           DomainPlacer, exact=False).market(H100)
    assert market.accepted[0].assignment == {"n2": 2}  # not the cheaper n1: it runs nothing


def test_an_auction_bid_refused_for_the_runtime_says_so_and_a_plain_bid_still_takes_the_gpus():
    nodes = [offer("s1/l1/n1", "1.00", "1.00", "1.00", "1.00")]
    market = clear_auction(LEVELS, nodes, [bid("work", 4, "3.00", RUNS_COMMANDS),
                                           bid("plain", 4, "2.00")],
                           DomainPlacer, exact=False).market(H100)
    assert [a.bid.id for a in market.accepted] == ["plain"]
    assert market.refused[0].reason == (
        "only 0 of 4 GPUs are on nodes that can run it; a workload needs nodes whose agent "
        "runs commands (runtime process or ssh)")


def test_on_demand_ssh_keys_skip_process_nodes_and_take_the_ssh_node():
    nodes = [on("process", offer("s1/l1/n1", "1.00", "1.00")),
             on("ssh", offer("s1/l1/n2", "2.00", "2.00"))]
    result = match_on_demand(LEVELS, nodes, [bid("keys", 2, "3.00", RUNS_SSH)], DomainPlacer)
    assert result.matched[0].assignment == {"n2": 2}


def test_on_demand_refused_for_the_runtime_names_the_runtime():
    nodes = [offer("s1/l1/n1", "1.00", "1.00"), on("process", offer("s1/l1/n2", "1.00"))]
    result = match_on_demand(LEVELS, nodes, [bid("work", 2, "3.00", RUNS_COMMANDS)],
                             DomainPlacer)
    assert result.refused[0].reason == (
        "only 1 of 2 GPUs are on nodes that can run it; a workload needs nodes whose agent "
        "runs commands (runtime process or ssh)")


def test_the_exact_solve_gives_a_workload_bid_no_gpus_of_nodes_running_nothing():
    nodes = [offer("s1/l1/n1", "0.00", "0.00"), on("process", offer("s1/l1/n2", "0.00"))]
    solution = solve_exact(LEVELS, nodes, [bid("work", 2, "2.00", RUNS_COMMANDS),
                                           bid("plain", 2, "1.00")])
    assert solution.accepted_ids == ("plain",)

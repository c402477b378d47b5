"""The `best_fit` gang rules, each case worked out by hand on TOPOLOGY_A / TOPOLOGY_B."""

import random

import pytest

from scheduler.core.placement import InvalidInput, Node, Request, Slice, place_gang
from tests.scheduler.core.placement.topologies import LEVELS, TOPOLOGY_A, TOPOLOGY_B, nodes_from


def assignment_of(nodes, request, levels=LEVELS):
    placement = place_gang(levels, nodes, request)
    assert placement.placed, placement.reason
    return dict(placement.assignment)


def reason_of(nodes, request, levels=LEVELS):
    placement = place_gang(levels, nodes, request)
    assert not placement.placed
    assert placement.assignment == {}
    return placement.reason


@pytest.mark.parametrize(
    "gpus, level, expected",
    [
        # leaves that hold 8: l1 (16), l3 (16), l4 (8): the tightest is l4
        (8, "leaf", {"n8": 8}),
        # l1 and l3 tie at 16, l1 comes first by path; no node holds 10, so the roomiest
        # node n1 goes whole and the remaining 2 go to the tightest node that fits them
        (10, "leaf", {"n1": 8, "n2": 2}),
        (6, "leaf", {"n3": 4, "n4": 2}),
        # spine s1 (22) is tighter than s2 (24); l1 whole, then 4 to the tightest leaf (l2)
        # and inside it to the tightest node (n3, exactly 4)
        (20, "spine", {"n1": 8, "n2": 8, "n3": 4}),
        # nodes with 3 free or more: the tightest is n3 (4)
        (3, "node", {"n3": 3}),
    ],
)
def test_required_level_picks_tightest_domain_that_fits(gpus, level, expected):
    assert assignment_of(TOPOLOGY_A, Request(gpus, required=level)) == expected


@pytest.mark.parametrize(
    "gpus, level, reason",
    [
        (17, "leaf", "only 16 of 17 GPUs fit within one leaf"),
        (25, "spine", "only 24 of 25 GPUs fit within one spine"),
        (9, "node", "only 8 of 9 GPUs fit within one node"),
    ],
)
def test_required_level_refuses_with_the_most_one_domain_holds(gpus, level, reason):
    assert reason_of(TOPOLOGY_A, Request(gpus, required=level)) == reason


@pytest.mark.parametrize(
    "request_, expected",
    [
        # a leaf holds it: same as required
        (Request(8, preferred="leaf"), {"n8": 8}),
        # no leaf holds 18 (max 16): the tightest spine s1; l1 whole, 2 to l2's n4
        (Request(18, preferred="leaf"), {"n1": 8, "n2": 8, "n4": 2}),
        # no spine holds 30 (max 24): the whole topology, on the fewest leaves: two
        # (l1 16 + l3 16), where filling s2 whole and the rest from s1 took three
        (Request(30, preferred="leaf"), {"n1": 8, "n2": 8, "n5": 8, "n6": 6}),
        # preferred leaf, required spine: escalates from leaf to spine only
        (Request(18, preferred="leaf", required="spine"), {"n1": 8, "n2": 8, "n4": 2}),
    ],
)
def test_preferred_level_escalates_one_level_at_a_time(request_, expected):
    assert assignment_of(TOPOLOGY_A, request_) == expected


@pytest.mark.parametrize(
    "request_, reason",
    [
        (Request(47, preferred="leaf"), "only 46 of 47 GPUs fit"),
        (Request(25, preferred="leaf", required="spine"),
         "only 24 of 25 GPUs fit within one spine"),
    ],
)
def test_preferred_level_refuses_only_when_the_widest_allowed_domain_cannot_hold_it(
    request_, reason
):
    assert reason_of(TOPOLOGY_A, request_) == reason


@pytest.mark.parametrize(
    "gpus, expected",
    [
        # one node holds it: the best-fit node, n6 (6 free)
        (5, {"n6": 5}),
        # equally tight nodes: the first by path
        (8, {"n1": 8}),
        # no node holds 11: as compactly as `preferred: node` would, the tightest leaf that
        # holds it (l1 16 and l3 16 tie; l1 first by path), its roomiest node whole, the rest
        # to the tightest node that holds it (once 4 nodes on 2 spines: smallest gaps first)
        (11, {"n1": 8, "n2": 3}),
        # no leaf holds 20: the spine that holds it on the fewest leaves (s1: l1 and l2)
        (20, {"n1": 8, "n2": 8, "n3": 4}),
    ],
)
def test_unconstrained_takes_best_fit_node_or_the_narrowest_domain(gpus, expected):
    assert assignment_of(TOPOLOGY_A, Request(gpus)) == expected


def test_unconstrained_refuses_when_the_whole_topology_cannot_hold_it():
    assert reason_of(TOPOLOGY_A, Request(47)) == "only 46 of 47 GPUs fit"


def test_inside_a_domain_fewest_leaves_come_before_fewest_nodes():
    # 12 in spine s1 of this topology: leaf l1 (8 + 2 + 2) holds it on three nodes, while
    # leaves l2 + l3 (two whole 8-GPU nodes) would use fewer nodes but two leaves.
    nodes = nodes_from({
        "s1/l1/a": 8, "s1/l1/b": 2, "s1/l1/c": 2,
        "s1/l2/d": 8,
        "s1/l3/e": 8,
    })
    assert assignment_of(nodes, Request(12, required="spine")) == {"a": 8, "b": 2, "c": 2}


@pytest.mark.parametrize(
    "request_, expected",
    [
        # slices per leaf: l1 2, l2 1, l3 3; best fit in slices: l1, its two whole nodes
        (Request(16, required="leaf", slice=Slice(8, "node")), {"n1": 8, "n2": 8}),
        # 8 GPUs in one slice: node n4 is whole; n5 (7) cannot hold a slice
        (Request(8, required="leaf", slice=Slice(8, "node")), {"n4": 8}),
        # unconstrained: the tightest leaf that holds 2 slices (l1, as `required: leaf`)
        (Request(16, slice=Slice(8, "node")), {"n1": 8, "n2": 8}),
        # 4 slices: no spine holds 4; the fewest leaves are two: the roomiest (l3, 3 slices)
        # whole, then 1 slice from the tightest leaf holding one (l2)
        (Request(32, slice=Slice(8, "node")), {"n4": 8, "n6": 8, "n7": 8, "n8": 8}),
    ],
)
def test_slices_count_capacity_in_whole_slices(request_, expected):
    assert assignment_of(TOPOLOGY_B, request_) == expected


def test_slices_refuse_by_slice_count_even_when_enough_gpus_are_free():
    # spine s1 has 36 free GPUs, but only 3 whole 8-GPU nodes
    request = Request(32, required="spine", slice=Slice(8, "node"))
    assert reason_of(TOPOLOGY_B, request) == "only 3 of 4 slices fit within one spine"


def test_slices_at_leaf_level_keep_each_group_inside_one_leaf():
    # each leaf has 6 free GPUs on two nodes: one group of 4 per leaf, never 3 groups
    nodes = nodes_from({"s1/l1/n1": 3, "s1/l1/n2": 3, "s1/l2/n3": 3, "s1/l2/n4": 3})
    eight = Request(8, slice=Slice(4, "leaf"))
    placement = place_gang(LEVELS, nodes, eight)
    leaf_of = {"n1": "l1", "n2": "l1", "n3": "l2", "n4": "l2"}
    per_leaf: dict[str, int] = {}
    for name, gpus in placement.assignment.items():
        per_leaf[leaf_of[name]] = per_leaf.get(leaf_of[name], 0) + gpus
    assert per_leaf == {"l1": 4, "l2": 4}
    assert reason_of(nodes, Request(12, slice=Slice(4, "leaf"))) == "only 2 of 3 slices fit"


def test_ties_are_broken_by_path_compared_as_strings_not_input_order():
    # l9 and l10 are identical; as strings "l10" < "l9"
    nodes = nodes_from({"s1/l9/a": 4, "s1/l10/b": 4})
    assert assignment_of(nodes, Request(4, required="leaf")) == {"b": 4}
    assert assignment_of(list(reversed(nodes)), Request(4, required="leaf")) == {"b": 4}


def test_shuffled_input_gives_the_same_placement():
    shuffled = list(TOPOLOGY_A)
    random.Random(7).shuffle(shuffled)
    for request in (Request(11), Request(18, preferred="leaf"), Request(3, required="node")):
        assert place_gang(LEVELS, shuffled, request) == place_gang(LEVELS, TOPOLOGY_A, request)


@pytest.mark.parametrize(
    "request_, domains, max_hops",
    [
        (Request(3, required="node"), {"spine": ("s1",), "leaf": ("l2",), "node": ("n3",)}, 0),
        (Request(10, required="leaf"),
         {"spine": ("s1",), "leaf": ("l1",), "node": ("n1", "n2")}, 2),
        (Request(20, required="spine"),
         {"spine": ("s1",), "leaf": ("l1", "l2"), "node": ("n1", "n2", "n3")}, 4),
        (Request(30), {"spine": ("s1", "s2"), "leaf": ("l1", "l3"),
                       "node": ("n1", "n2", "n5", "n6")}, 6),
    ],
)
def test_placement_names_domains_used_and_worst_hop_distance(request_, domains, max_hops):
    placement = place_gang(LEVELS, TOPOLOGY_A, request_)
    assert dict(placement.domains) == domains
    assert placement.max_hops == max_hops


def test_level_names_are_free_and_two_levels_work():
    nodes = nodes_from({"b1/r1": 8, "b1/r2": 4, "b2/r3": 8}, levels=("block", "rack"))
    placement = place_gang(("block", "rack"), nodes, Request(12, required="block"))
    assert dict(placement.assignment) == {"r1": 8, "r2": 4}
    assert placement.max_hops == 2
    assert reason_of(nodes, Request(13, required="block"), levels=("block", "rack")) == (
        "only 12 of 13 GPUs fit within one block"
    )


def test_a_single_level_topology_is_just_nodes():
    nodes = [Node("a", {}, 4), Node("b", {}, 8)]
    assert dict(place_gang(["node"], nodes, Request(6, required="node")).assignment) == {"b": 6}
    placement = place_gang(["node"], nodes, Request(10))
    # the roomiest node whole, the rest to the tightest node that holds it
    assert dict(placement.assignment) == {"a": 2, "b": 8}
    assert placement.max_hops == 2


def test_placement_json_carries_exactly_the_contract_keys():
    placed = place_gang(LEVELS, TOPOLOGY_A, Request(3, required="node")).to_json()
    assert placed == {"placed": True, "assignment": {"n3": 3},
                      "domains": {"spine": ["s1"], "leaf": ["l2"], "node": ["n3"]},
                      "max_hops": 0}
    refused = place_gang(LEVELS, TOPOLOGY_A, Request(9, required="node")).to_json()
    assert refused == {"placed": False, "reason": "only 8 of 9 GPUs fit within one node"}


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: Node("a", {}, -1), "free_gpus"),
        (lambda: Node("", {}, 1), "name"),
        (lambda: Node("a", {}, 1, state="asleep"), "state"),
        (lambda: Node("a", {}, 4, total_gpus=2), "total_gpus"),
        (lambda: Request(0), "request.gpus"),
        (lambda: Request(12, slice=Slice(8, "node")), "request.slice.size"),
        (lambda: Request(8, slice=Slice(0, "node")), "request.slice.size"),
        (lambda: Request(8, min_cpu_milli_per_gpu=-1), "request.min_cpu_milli_per_gpu"),
    ],
)
def test_malformed_plain_data_names_the_field(make, field):
    with pytest.raises(InvalidInput) as error:
        make()
    assert error.value.field == field

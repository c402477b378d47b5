"""Profiles other than best_fit: `spread` and `least_free`, on TOPOLOGY_A."""

import pytest

from scheduler.core.placement import InvalidInput, Request, Slice, place_gang
from tests.scheduler.core.placement.topologies import LEVELS, TOPOLOGY_A


@pytest.mark.parametrize(
    "request_, expected",
    [
        # one GPU on each of three nodes, the tightest nodes first: n4 (2), n7 (2), n3 (4)
        (Request(3), {"n3": 1, "n4": 1, "n7": 1}),
        # within one leaf: l3 is the only leaf with three usable nodes
        (Request(3, required="leaf"), {"n5": 1, "n6": 1, "n7": 1}),
        # groups of 8, one per leaf: leaves with 8 free are l4 (8), l1 (16), l3 (16);
        # the tightest two are l4 and l1, and inside l1 the tightest node n1
        (Request(16, slice=Slice(8, "leaf")), {"n1": 8, "n8": 8}),
        # groups of 2 GPUs, one per node, within one spine: both spines have four nodes with
        # 2 free; s1 is the tighter (22 GPUs against 24); its tightest three: n4, n3, n1
        (Request(6, required="spine", slice=Slice(2, "node")), {"n1": 2, "n3": 2, "n4": 2}),
    ],
)
def test_spread_puts_one_group_per_failure_domain(request_, expected):
    placement = place_gang(LEVELS, TOPOLOGY_A, request_, profile="spread")
    assert placement.placed, placement.reason
    assert dict(placement.assignment) == expected


def test_spread_refuses_when_too_few_distinct_domains():
    placement = place_gang(LEVELS, TOPOLOGY_A, Request(4, required="leaf"), profile="spread")
    assert placement.reason == "only 3 of 4 slices fit one per node within one leaf"
    placement = place_gang(LEVELS, TOPOLOGY_A, Request(9), profile="spread")
    assert placement.reason == "only 8 of 9 slices fit one per node"


def test_spread_rejects_a_spread_level_at_or_above_the_scope():
    with pytest.raises(InvalidInput) as error:
        place_gang(LEVELS, TOPOLOGY_A, Request(2, required="leaf", slice=Slice(1, "leaf")),
                   profile="spread")
    assert error.value.field == "request.slice.level"


@pytest.mark.parametrize(
    "request_, expected",
    [
        # scope s1 as for best_fit; then nodes by least free: n4 2, n3 4, then 4 from n1
        # (best_fit would keep to leaf l1: n1 8, n2 2)
        (Request(10, required="spine"), {"n1": 4, "n3": 4, "n4": 2}),
        # one node holds it: the least free that fits
        (Request(2, required="spine"), {"n4": 2}),
        # whole-node slices inside s1: n1 and n2 are the only 8-free nodes
        (Request(16, required="spine", slice=Slice(8, "node")), {"n1": 8, "n2": 8}),
    ],
)
def test_least_free_packs_the_fullest_nodes_inside_the_scope(request_, expected):
    placement = place_gang(LEVELS, TOPOLOGY_A, request_, profile="least_free")
    assert placement.placed, placement.reason
    assert dict(placement.assignment) == expected


def test_unknown_profile_is_rejected_by_name():
    with pytest.raises(InvalidInput) as error:
        place_gang(LEVELS, TOPOLOGY_A, Request(1), profile="worst_fit")
    assert error.value.field == "profile"

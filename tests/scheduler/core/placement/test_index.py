"""The index: build once, place many, commit and release incrementally."""

import pytest

from scheduler.core.placement import InvalidInput, Node, PlacementIndex, Request
from tests.scheduler.core.placement.topologies import LEVELS, TOPOLOGY_A


def test_place_changes_nothing_until_committed():
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    first = index.place(Request(8))
    assert index.place(Request(8)) == first
    assert dict(first.assignment) == {"n1": 8}


def test_committed_gpus_are_not_offered_again_and_release_gives_them_back():
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    taken = index.place(Request(8)).assignment
    index.commit(taken)
    assert dict(index.place(Request(8)).assignment) == {"n2": 8}
    assert index.free_gpus("n1") == 0
    index.release(taken)
    assert dict(index.place(Request(8)).assignment) == {"n1": 8}


def test_commit_updates_domain_capacity_for_required_levels():
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    index.commit({"n5": 8})  # leaf l3 falls from 16 to 8
    assert dict(index.place(Request(10, required="leaf")).assignment) == {"n1": 8, "n2": 2}
    index.commit({"n1": 8})
    assert index.place(Request(10, required="leaf")).reason == (
        "only 8 of 10 GPUs fit within one leaf"
    )


@pytest.mark.parametrize(
    "method, assignment, field",
    [
        ("commit", {"n4": 3}, "assignment.n4"),
        ("commit", {"zz": 1}, "assignment.zz"),
        ("commit", {"n4": -1}, "assignment.n4"),
        ("release", {"n1": 1}, "assignment.n1"),
    ],
)
def test_commit_and_release_refuse_impossible_changes(method, assignment, field):
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    with pytest.raises(InvalidInput) as error:
        getattr(index, method)(assignment)
    assert error.value.field == field


def test_a_refused_commit_changes_nothing():
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    with pytest.raises(InvalidInput):
        index.commit({"n1": 8, "n4": 3})
    assert index.free_gpus("n1") == 8


def test_release_is_bounded_by_total_gpus():
    node = Node("a", {"spine": "s", "leaf": "l"}, free_gpus=2, total_gpus=8)
    index = PlacementIndex(LEVELS, [node])
    index.release({"a": 6})
    assert index.free_gpus("a") == 8


@pytest.mark.parametrize(
    "levels, nodes, field",
    [
        ((), [], "levels"),
        (("leaf", "leaf"), [], "levels"),
        (LEVELS, [Node("a", {"spine": "s"}, 1)], "nodes[0].labels.leaf"),
        (LEVELS, [Node("a", {"spine": "s", "leaf": "l"}, 1)] * 2, "nodes[1].name"),
    ],
)
def test_malformed_topology_names_the_field(levels, nodes, field):
    with pytest.raises(InvalidInput) as error:
        PlacementIndex(levels, nodes)
    assert error.value.field == field


def test_unknown_level_in_request_names_the_field():
    index = PlacementIndex(LEVELS, TOPOLOGY_A)
    for request, field in (
        (Request(1, required="rack"), "request.required"),
        (Request(1, preferred="rack"), "request.preferred"),
        (Request(1, preferred="spine", required="leaf"), "request.preferred"),
    ):
        with pytest.raises(InvalidInput) as error:
            index.place(request)
        assert error.value.field == field

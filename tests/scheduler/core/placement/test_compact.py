"""Compact multi-node placement under load: the fewest leaves, whole leaves kept whole.

Nodes carry `total_gpus=8`, so a leaf is *whole* when all its GPUs are free and *broken*
otherwise; every case is worked out by hand.
"""

from scheduler.core.placement import Node, PlacementIndex, Request, place_gang

LEVELS = ("spine", "leaf", "node")


def nodes_from(free_by_path: dict[str, int]) -> list[Node]:
    out = []
    for path, free in free_by_path.items():
        spine, leaf, name = path.split("/")
        out.append(Node(name=name, labels={"spine": spine, "leaf": leaf}, free_gpus=free,
                        total_gpus=8))
    return out


def leaves_of(nodes, request):
    placement = place_gang(LEVELS, nodes, request)
    assert placement.placed, placement.reason
    return placement.domains["leaf"], dict(placement.assignment)


def test_a_two_node_job_goes_to_one_leaf_when_one_leaf_has_room():
    # the first nodes by path (l1, l2) and the tightest (l1's 8-free nodes beside full ones)
    # are spread over two leaves; only l3 holds 16 GPUs by itself
    nodes = nodes_from({
        "s1/l1/a1": 8, "s1/l1/a2": 0, "s1/l1/a3": 0,
        "s1/l2/b1": 8, "s1/l2/b2": 0, "s1/l2/b3": 0,
        "s1/l3/c1": 8, "s1/l3/c2": 8, "s1/l3/c3": 0,
    })
    for request in (Request(16, preferred="node"), Request(16, preferred="leaf"),
                    Request(16, required="spine"), Request(16)):
        assert leaves_of(nodes, request) == (("l3",), {"c1": 8, "c2": 8})


def test_a_spanning_job_goes_to_the_spine_that_needs_the_fewest_leaves():
    # no leaf holds 24; s1 is the tighter spine (28 free) but needs 4 leaves of 7,
    # s2 (40 free) holds it in 2 leaves
    nodes = nodes_from({
        "s1/l1/a1": 7, "s1/l2/b1": 7, "s1/l3/c1": 7, "s1/l4/d1": 7,
        "s2/l5/e1": 8, "s2/l5/e2": 8, "s2/l6/f1": 8, "s2/l6/f2": 8, "s2/l7/g1": 8,
    })
    leaves, assignment = leaves_of(nodes, Request(24, preferred="leaf"))
    assert len(leaves) == 2 and set(leaves) <= {"l5", "l6", "l7"}
    assert sum(assignment.values()) == 24


def test_among_leaves_of_equal_fit_the_one_leaving_more_whole_leaves_free():
    # 12 GPUs need two leaves of 8 either way: the whole l1 and a broken one, or the broken
    # l2 and l3; the broken pair leaves l1 whole
    nodes = nodes_from({
        "s1/l1/a1": 8,
        "s1/l2/b1": 8, "s1/l2/b2": 0,
        "s1/l3/c1": 8, "s1/l3/c2": 0,
    })
    leaves, assignment = leaves_of(nodes, Request(12, required="spine"))
    assert leaves == ("l2", "l3")
    assert assignment == {"b1": 8, "c1": 4}


def test_a_whole_leaf_is_broken_only_when_no_broken_leaf_holds_the_job():
    # heterogeneous leaves: the whole l1 (8) is tighter than the broken l2 (12 of 16 free),
    # but an 8-GPU job goes to the broken one
    nodes = nodes_from({
        "s1/l1/a1": 8,
        "s1/l2/b1": 8, "s1/l2/b2": 4,
    })
    assert leaves_of(nodes, Request(8, required="leaf")) == (("l2",), {"b1": 8})


def test_a_one_gpu_job_goes_to_a_broken_leaf_rather_than_breaking_a_whole_one():
    # every node with room is wholly free; l1 comes first by path but is whole, l2 has a
    # full node beside its free one
    nodes = nodes_from({
        "s1/l1/a1": 8, "s1/l1/a2": 8,
        "s1/l2/b1": 0, "s1/l2/b2": 8,
    })
    for request in (Request(1), Request(1, required="node"), Request(1, preferred="leaf")):
        assert leaves_of(nodes, request) == (("l2",), {"b2": 1})


def test_single_gpu_jobs_fill_a_broken_spine_before_breaking_a_whole_one():
    nodes = nodes_from({
        "s1/l1/a1": 8, "s1/l2/b1": 8,
        "s2/l3/c1": 8, "s2/l4/d1": 0,
    })
    index = PlacementIndex(LEVELS, nodes)
    for _ in range(8):
        placement = index.place(Request(1))
        assert placement.domains["spine"] == ("s2",)
        index.commit(placement.assignment)
    # s2 is full now; the next breaks one leaf of s1 and stays there
    first = index.place(Request(1))
    index.commit(first.assignment)
    assert index.place(Request(1)).domains["leaf"] == first.domains["leaf"]


def test_an_unconstrained_16_gpu_request_lands_on_one_leaf_when_possible():
    # the smallest gaps (1-2 free GPUs on l1 and l2) once drew it over three leaves
    nodes = nodes_from({
        "s1/l1/a1": 1, "s1/l1/a2": 2, "s1/l1/a3": 1,
        "s1/l2/b1": 2, "s1/l2/b2": 1,
        "s2/l3/c1": 8, "s2/l3/c2": 8, "s2/l3/c3": 3,
    })
    leaves, assignment = leaves_of(nodes, Request(16))
    assert leaves == ("l3",)
    assert assignment == {"c1": 8, "c2": 8}
    assert place_gang(LEVELS, nodes, Request(16)).max_hops == 2

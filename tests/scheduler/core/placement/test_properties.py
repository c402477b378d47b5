"""Properties that hold for every topology and request (hypothesis)."""

import random
from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler.core.placement import InvalidInput, Node, PlacementIndex, Request, Slice, place_gang
from tests.scheduler.core.placement.topologies import LEVELS

FEW = settings(max_examples=150, deadline=None)
LEVEL_OR_NONE = st.sampled_from([None, "spine", "leaf", "node"])
ANY_SLICING = st.booleans()


@st.composite
def topologies(draw):
    nodes = []
    for s in range(draw(st.integers(1, 3))):
        for leaf in range(draw(st.integers(1, 3))):
            for n in range(draw(st.integers(1, 4))):
                nodes.append(Node(name=f"n{s}{leaf}{n}",
                                  labels={"spine": f"s{s}", "leaf": f"l{s}{leaf}"},
                                  free_gpus=draw(st.integers(0, 8)), total_gpus=8))
    return nodes


@st.composite
def requests(draw, required=LEVEL_OR_NONE, sliced=ANY_SLICING):
    slice_ = None
    if draw(sliced):
        slice_ = Slice(draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from(["leaf", "node"])))
    gpus = draw(st.integers(1, 8)) * slice_.size if slice_ else draw(st.integers(1, 30))
    required_level = draw(required)
    # preferred at or below the required level; above it is malformed, not a placement
    deeper = LEVELS[LEVELS.index(required_level):] if required_level else LEVELS
    preferred = draw(st.none() | st.sampled_from(deeper))
    return Request(gpus, required=required_level, preferred=preferred, slice=slice_)


PROFILES = st.sampled_from(["best_fit", "least_free", "spread"])


def place_or_discard(nodes, request, profile):
    try:
        return place_gang(LEVELS, nodes, request, profile)
    except InvalidInput:
        assume(False)  # e.g. preferred above required: not a placement question


def path_of(node):
    return (node.labels["spine"], node.labels["leaf"], node.name)


@FEW
@given(topologies(), requests(), PROFILES)
def test_placement_is_all_or_nothing_and_never_exceeds_free_gpus(nodes, request, profile):
    placement = place_or_discard(nodes, request, profile)
    free = {n.name: n.free_gpus for n in nodes}
    if placement.placed:
        assert sum(placement.assignment.values()) == request.gpus
        assert all(0 < gpus <= free[name] for name, gpus in placement.assignment.items())
    else:
        assert placement.assignment == {}
        assert placement.reason.startswith("only ")


@FEW
@given(topologies(), requests(required=st.sampled_from(LEVELS)), PROFILES)
def test_required_level_contains_the_whole_placement(nodes, request, profile):
    placement = place_or_discard(nodes, request, profile)
    if placement.placed:
        assert len(placement.domains[request.required]) == 1
    else:
        assert placement.reason.endswith(f"within one {request.required}")


@FEW
@given(topologies(), requests(sliced=st.just(True)), PROFILES)
def test_every_slice_lies_inside_one_domain_of_its_level(nodes, request, profile):
    placement = place_or_discard(nodes, request, profile)
    if not placement.placed:
        assert " slices fit" in placement.reason
        return
    depth = LEVELS.index(request.slice.level)
    by_name = {n.name: n for n in nodes}
    per_domain: dict[tuple, int] = {}
    for name, gpus in placement.assignment.items():
        domain = path_of(by_name[name])[: depth + 1]
        per_domain[domain] = per_domain.get(domain, 0) + gpus
    if profile == "spread":
        assert set(per_domain.values()) == {request.slice.size}
    else:
        assert all(gpus % request.slice.size == 0 for gpus in per_domain.values())


@FEW
@given(topologies(), st.integers(1, 40), LEVEL_OR_NONE)
def test_best_fit_places_exactly_when_some_domain_holds_the_request(nodes, gpus, required):
    placement = place_gang(LEVELS, nodes, Request(gpus, required=required))
    if required is None:
        most = sum(n.free_gpus for n in nodes)
    else:
        depth = LEVELS.index(required)
        free_by_domain: dict[tuple, int] = {}
        for node in nodes:
            domain = path_of(node)[: depth + 1]
            free_by_domain[domain] = free_by_domain.get(domain, 0) + node.free_gpus
        most = max(free_by_domain.values())
    assert placement.placed == (most >= gpus)


@FEW
@given(topologies(), requests(), PROFILES, st.randoms(use_true_random=False))
def test_shuffled_input_gives_the_same_answer(nodes, request, profile, rng):
    placement = place_or_discard(nodes, request, profile)
    shuffled = list(nodes)
    rng.shuffle(shuffled)
    assert place_gang(LEVELS, shuffled, request, profile) == placement


@FEW
@given(topologies(), requests(), PROFILES)
def test_a_per_node_filter_that_limits_nothing_changes_nothing(nodes, request, profile):
    # min CPU per GPU on nodes that report no CPU limits nothing, but runs the per-node pass
    placement = place_or_discard(nodes, request, profile)
    filtered = place_gang(LEVELS, nodes, replace(request, min_cpu_milli_per_gpu=1), profile)
    assert filtered == placement


@FEW
@given(topologies(), requests(), PROFILES, st.data())
def test_excluded_nodes_are_never_used_and_placing_leaves_the_index_unchanged(
    nodes, request, profile, data
):
    excluded = data.draw(st.sets(st.sampled_from([n.name for n in nodes])))
    index = PlacementIndex(LEVELS, nodes)
    try:
        placement = index.place(replace(request, exclude_nodes=frozenset(excluded)), profile)
    except InvalidInput:
        assume(False)
    assert not excluded & set(placement.assignment)
    assert index.current_nodes() == PlacementIndex(LEVELS, nodes).current_nodes()
    assert index.place(request, profile) == place_gang(LEVELS, nodes, request, profile)


@settings(max_examples=60, deadline=None)
@given(topologies(), st.lists(requests(), min_size=1, max_size=6), st.integers(0, 2**16))
def test_commits_and_releases_leave_the_index_as_a_fresh_build(nodes, batch, seed):
    index = PlacementIndex(LEVELS, nodes)
    held = []
    rng = random.Random(seed)
    for request in batch:
        try:
            placement = index.place(request)
        except InvalidInput:
            continue
        if placement.placed:
            index.commit(placement.assignment)
            held.append(placement.assignment)
        if held and rng.random() < 0.3:
            index.release(held.pop(rng.randrange(len(held))))
    fresh = PlacementIndex(LEVELS, index.current_nodes())
    for request in batch:
        try:
            expected = fresh.place(request)
        except InvalidInput:
            continue
        assert index.place(request) == expected


def free_by_domain(nodes, level):
    depth = LEVELS.index(level)
    totals: dict[tuple, int] = {}
    for node in nodes:
        domain = path_of(node)[: depth + 1]
        totals[domain] = totals.get(domain, 0) + node.free_gpus
    return totals


def whole_by_domain(nodes, depth):
    """Whether every GPU under each domain is free."""
    whole: dict[tuple, bool] = {}
    for node in nodes:
        domain = path_of(node)[: depth + 1]
        whole[domain] = whole.get(domain, True) and node.free_gpus == node.capacity_gpus
    return whole


def fewest_leaves_and_breaks(nodes, spine, gpus):
    """By brute force: the fewest leaves of `spine` that hold `gpus`, and the fewest whole
    leaves among such sets."""
    from itertools import combinations

    free = {k: v for k, v in free_by_domain(nodes, "leaf").items() if k[0] == spine and v}
    whole = whole_by_domain(nodes, 1)
    for count in range(1, len(free) + 1):
        sets = [c for c in combinations(free, count) if sum(free[k] for k in c) >= gpus]
        if sets:
            return count, min(sum(whole[k] for k in c) for c in sets)
    raise AssertionError("the spine holds the request")


@FEW
@given(topologies(), st.integers(1, 16), st.sampled_from(LEVELS))
def test_best_fit_uses_the_most_compact_then_tightest_domain_that_holds_the_request(
    nodes, gpus, level
):
    """Nodes: the tightest. Leaves: a broken leaf before a whole one, then the tightest.
    Spines: the fewest leaves, then the fewest whole leaves broken, then the tightest."""
    placement = place_gang(LEVELS, nodes, Request(gpus, required=level))
    assume(placement.placed)
    depth = LEVELS.index(level)
    totals = free_by_domain(nodes, level)
    whole = whole_by_domain(nodes, depth)
    by_name = {n.name: n for n in nodes}
    chosen = path_of(by_name[next(iter(placement.assignment))])[: depth + 1]
    fitting = [d for d, free in totals.items() if free >= gpus]

    def key(domain):
        if level == "node":
            return (totals[domain],)
        if level == "leaf":
            return (whole[domain], totals[domain])
        return (*fewest_leaves_and_breaks(nodes, domain[0], gpus), totals[domain])

    assert key(chosen) == min(key(d) for d in fitting)


@FEW
@given(topologies(), st.integers(1, 8))
def test_unconstrained_request_that_fits_one_node_takes_the_tightest_node(nodes, gpus):
    fitting = [n.free_gpus for n in nodes if n.free_gpus >= gpus]
    assume(fitting)
    placement = place_gang(LEVELS, nodes, Request(gpus))
    [(name, taken)] = placement.assignment.items()
    assert taken == gpus
    assert next(n for n in nodes if n.name == name).free_gpus == min(fitting)

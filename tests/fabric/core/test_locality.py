import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.core.locality import (
    CONSTRAINT_LEVELS,
    LEVEL_RANK,
    LEVELS,
    ONE_FABRIC_WIDEST_FIRST,
    WIDEST_FIRST,
    Locality,
    NodeKey,
    max_hops,
)


def test_the_level_orders_are_one_vocabulary():
    assert LEVELS == ("node", "leaf", "spine", "fabric")
    assert WIDEST_FIRST == ("fabric", "spine", "leaf", "node")
    assert CONSTRAINT_LEVELS == ("node", "leaf", "spine")
    assert ONE_FABRIC_WIDEST_FIRST == ("spine", "leaf", "node")
    assert LEVEL_RANK == {"node": 0, "leaf": 1, "spine": 2, "fabric": 3}


def test_a_node_key_names_its_domains_with_its_fabric():
    key = NodeKey("fab1", "s1", "l2", "gpu07")
    assert (key.fabric, key.spine, key.leaf, key.host) == ("fab1", "s1", "l2", "gpu07")
    assert key.labels == {"fabric": "fab1", "spine": "fab1/s1", "leaf": "fab1/l2"}


A = NodeKey("f", "s1", "l1", "n1")
A2 = NodeKey("f", "s1", "l1", "n2")
B = NodeKey("f", "s1", "l2", "n3")
C = NodeKey("f", "s2", "l3", "n4")
OTHER_FABRIC = NodeKey("g", "s1", "l1", "m1")


@pytest.mark.parametrize(("keys", "shown"), [
    ([], {}),
    ([A, A], {"leaves": 1, "spines": 1, "max_hops": 0}),
    ([A, A2], {"leaves": 1, "spines": 1, "max_hops": 2}),
    ([A, B], {"leaves": 2, "spines": 1, "max_hops": 4}),
    ([A, B, C], {"leaves": 3, "spines": 2, "max_hops": 6}),
    ([A, OTHER_FABRIC], {"leaves": 2, "spines": 2, "max_hops": 6}),
])
def test_locality_of_gpus(keys, shown):
    assert Locality.of(keys).to_json() == shown


def test_plain_tuples_are_keys_too():
    assert Locality.of([tuple(A), tuple(B)]) == Locality(leaves=2, spines=1, max_hops=4)


def test_the_shown_keys_keep_their_order():
    assert list(Locality.of([A]).to_json()) == ["leaves", "spines", "max_hops"]


@pytest.mark.parametrize(("paths", "hops"), [
    ([], 0),
    ([("f", "s", "l", "n1")], 0),
    ([("f", "s", "l", "n1"), ("f", "s", "l", "n2")], 2),
    ([("f", "s", "l1", "n1"), ("f", "s", "l2", "n2")], 4),
    ([("f", "s1", "l1", "n1"), ("f", "s2", "l2", "n2")], 6),
    ([("f", "s1", "l1", "n1"), ("g", "s1", "l1", "n1")], 8),
])
def test_max_hops_climbs_two_per_level(paths, hops):
    assert max_hops(paths) == hops


names = st.sampled_from(["a", "b"])


@given(st.lists(st.tuples(names, names, names, names), min_size=1, max_size=6))
def test_max_hops_needs_no_sorted_paths(paths):
    assert max_hops(paths) == max_hops(sorted(paths))

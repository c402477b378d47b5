import numpy as np
import pytest

from fabric.core.generators import dragonfly, fat_tree, torus
from fabric.core.levels import compute_domains
from fabric.core.topology import SnapshotNode, TopologySnapshot
from tests.fabric.builders import tree_spec

# Two spine domains: S1 over leaves L1 (a1, a2) and L2 (b1); S2 over L3 (c1, c2, c3).
ROWS = [
    SnapshotNode("a1", "L1", "S1", 8),
    SnapshotNode("a2", "L1", "S1", 8),
    SnapshotNode("b1", "L2", "S1", 4),
    ("c1", "L3", "S2", 8),
    ("c2", "L3", "S2", 8),
    ("c3", "L3", "S2", 8),
]


@pytest.fixture
def snapshot():
    return TopologySnapshot.from_domains(
        ROWS, host_gbps=400, leaf_uplink_gbps={"L1": 400, "L2": 800, "L3": 1200},
        spine_uplink_gbps={"S1": 300, "S2": 2400},
    )


def test_domain_of_each_level(snapshot):
    assert [snapshot.domain_of("b1", level) for level in ("node", "leaf", "spine", "fabric")] == [
        "b1", "L2", "S1", "fabric"]


def test_lowest_common_level(snapshot):
    assert snapshot.lowest_common_level("a1", "a1") == "node"
    assert snapshot.lowest_common_level("a1", "a2") == "leaf"
    assert snapshot.lowest_common_level("a1", "b1") == "spine"
    assert snapshot.lowest_common_level("a1", "c1") == "fabric"


def test_tree_hops_count_links_up_and_down(snapshot):
    assert [snapshot.hops("a1", x) for x in ("a1", "a2", "b1", "c1")] == [0, 2, 4, 6]


def test_batch_hops_agree_with_single_queries(snapshot):
    pairs = [(a, b) for a in snapshot.nodes for b in snapshot.nodes]
    assert snapshot.hops_many(pairs) == [snapshot.hops(a, b) for a, b in pairs]
    ids = np.arange(len(snapshot.nodes))
    assert snapshot.common_level_ids(ids, ids[::-1]).tolist() == [
        snapshot.common_rank(a, b) for a, b in zip(snapshot.nodes, snapshot.nodes[::-1], strict=True)]


def test_nodes_and_domains_of_each_level(snapshot):
    assert snapshot.domains("leaf") == ("L1", "L2", "L3")
    assert snapshot.domains("spine") == ("S1", "S2")
    assert snapshot.nodes_in("spine", "S1") == ("a1", "a2", "b1")
    assert snapshot.nodes_in("leaf", "L3") == ("c1", "c2", "c3")
    assert snapshot.nodes_in("fabric", "fabric") == snapshot.nodes
    assert snapshot.nodes_in("node", "b1") == ("b1",)


def test_gpus_of_a_node(snapshot):
    assert snapshot.gpus_of("b1") == 4


def test_bandwidth_is_the_narrowest_egress_on_the_way_up(snapshot):
    # L1: 2 hosts x 400 = 800 down, 400 up -> 400; L2: 400 down, 800 up -> 400.
    assert snapshot.bandwidth_between("L1", "L2") == 400
    # Across spines S1 (1200 host, 300 up) and S2: S1's uplinks bind.
    assert snapshot.bandwidth_between("L3", "L2") == 300
    assert snapshot.bandwidth_between(("spine", "S2"), ("spine", "S1")) == 300
    assert snapshot.bandwidth_between("c1", "c2") == 400
    # Nested domains: traffic stays inside, limited by the inner domain's host links.
    assert snapshot.bandwidth_between("L3", "c1") == 400
    assert snapshot.bandwidth_between("L3", "L3") == 1200


def test_bandwidth_is_unknown_without_link_rates():
    assert TopologySnapshot.from_domains(ROWS).bandwidth_between("L1", "L2") is None


def test_snapshot_is_immutable(snapshot):
    with pytest.raises(AttributeError):
        snapshot.kind = "torus"


def test_from_spec_estimates_bandwidth_from_links_and_oversubscription():
    # Leaves of 4 hosts at 100 Gb/s with two 100 Gb/s uplinks: 2:1 oversubscribed.
    hosts = {f"n{i}": ["L1" if i <= 4 else "L2"] for i in range(1, 9)}
    spec = tree_spec(hosts, {"L1": ["S1", "S1"], "L2": ["S1", "S1"]})
    snapshot = TopologySnapshot.from_spec(spec)
    assert snapshot.bandwidth_between("L1", "L2") == 200
    assert snapshot.bandwidth_between("n1", "n5") == 100


def test_from_spec_and_from_domains_answer_alike():
    spec = fat_tree(40, 8, tiers=3)
    rows = [(h, d.leaf, d.spine, 8) for h, d in compute_domains(spec).items()]
    built, loaded = TopologySnapshot.from_spec(spec), TopologySnapshot.from_domains(rows)
    assert built.nodes == loaded.nodes
    assert all(built.hops("node01", n) == loaded.hops("node01", n) for n in built.nodes)
    assert built.domains("spine") == loaded.domains("spine")


def test_torus_hops_take_the_shorter_way_round():
    snapshot = TopologySnapshot.from_spec(torus(8, 4, 2))
    corner = {snapshot.domain_of(n, "leaf"): n for n in snapshot.nodes}
    origin = corner["r0-0-0"]
    assert snapshot.hops(origin, origin) == 0
    assert snapshot.hops(origin, corner["r1-0-0"]) == 3  # host, 1 router hop, host
    assert snapshot.hops(origin, corner["r7-0-0"]) == 3  # wrap-around: 1 hop, not 7
    assert snapshot.hops(origin, corner["r4-2-1"]) == 2 + 4 + 2 + 1
    pairs = [(origin, n) for n in snapshot.nodes]
    assert snapshot.hops_many(pairs) == [snapshot.hops(a, b) for a, b in pairs]


def test_torus_snapshot_needs_coordinates():
    with pytest.raises(ValueError, match="torus"):
        TopologySnapshot.from_domains([("n1", "r1", "box", 8)], kind="torus", torus_dims=(2, 2, 2))


def test_dragonfly_levels_and_hops():
    snapshot = TopologySnapshot.from_spec(dragonfly(a=2, p=2, h=1))
    assert snapshot.domain_of("node01", "spine") == "g01"
    assert [snapshot.hops("node01", n) for n in ("node02", "node03", "node05")] == [2, 3, 5]
    assert snapshot.lowest_common_level("node01", "node03") == "spine"

"""The topology the local Slurm cluster (cluster.py) is started with: leaves of a given size."""

from tests.agent.slurm.cluster import NODES, leaves_of, node_names, tree_topology


def test_the_test_cluster_has_two_leaves_of_two_nodes_under_one_spine():
    assert tree_topology(NODES, 2) == (
        "SwitchName=leaf1 Nodes=n[001-002]\n"
        "SwitchName=leaf2 Nodes=n[003-004]\n"
        "SwitchName=spine Switches=leaf[1-2]\n"
    )


def test_a_cluster_that_is_not_a_multiple_of_the_leaf_size_ends_with_a_short_leaf():
    leaves = leaves_of(node_names(20), 8)
    assert {leaf: len(nodes) for leaf, nodes in leaves.items()} == {
        "leaf1": 8, "leaf2": 8, "leaf3": 4}
    assert leaves["leaf3"] == ["n017", "n018", "n019", "n020"]
    assert tree_topology(node_names(20), 8).splitlines()[-2:] == [
        "SwitchName=leaf3 Nodes=n[017-020]", "SwitchName=spine Switches=leaf[1-3]"]


def test_node_names_grow_a_digit_past_999_nodes():
    assert node_names(1000)[-1] == "n1000"
    assert node_names(1000)[0] == "n0001"

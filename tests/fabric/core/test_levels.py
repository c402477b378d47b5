import pytest

from fabric.core.generators import dragonfly, fat_tree, torus
from fabric.core.levels import NodeDomains, analyse, compute_domains, summarise
from tests.fabric.builders import tree_spec


def test_leaf_domain_is_the_leaf_switch_and_spine_domain_its_spine():
    spec = tree_spec({"n1": ["L1"], "n2": ["L1"], "n3": ["L2"]}, {"L1": ["S1"], "L2": ["S1"]})
    assert compute_domains(spec) == {
        "n1": NodeDomains("L1", "S1"), "n2": NodeDomains("L1", "S1"), "n3": NodeDomains("L2", "S1"),
    }


def test_tiers_are_inferred_from_where_hosts_and_leaves_sit():
    spec = tree_spec({"n1": ["L1"], "n2": ["L2"]},
                     {"L1": ["S1"], "L2": ["S2"], "S1": ["C1"], "S2": ["C1"]})
    tiers = {s.name: analyse(spec).tiers[s.guid] for s in spec.switches}
    assert tiers == {"C1": "core", "L1": "leaf", "L2": "leaf", "S1": "spine", "S2": "spine"}


def test_multi_rooted_spines_that_reach_the_same_leaves_collapse_into_one_group():
    # L1, L2 hang under S1 and S2; L3, L4 under S3 and S4; the cores join everything.
    spec = tree_spec(
        {"n1": ["L1"], "n2": ["L2"], "n3": ["L3"], "n4": ["L4"]},
        {"L1": ["S1", "S2"], "L2": ["S1", "S2"], "L3": ["S3", "S4"], "L4": ["S3", "S4"],
         "S1": ["C1"], "S2": ["C2"], "S3": ["C1"], "S4": ["C2"]},
    )
    domains = compute_domains(spec)
    assert [domains[n].spine for n in ("n1", "n2", "n3", "n4")] == ["S1..S2", "S1..S2",
                                                                    "S3..S4", "S3..S4"]


def test_spines_with_overlapping_leaves_are_joined_rather_than_picking_a_parent():
    # L2 sits under both S1 and S2, so S1's and S2's leaves cannot be told apart by a parent.
    spec = tree_spec({"n1": ["L1"], "n2": ["L2"], "n3": ["L3"]},
                     {"L1": ["S1"], "L2": ["S1", "S2"], "L3": ["S2"]})
    assert {d.spine for d in compute_domains(spec).values()} == {"S1..S2"}


def test_rail_optimised_hosts_share_one_leaf_domain_per_scalable_unit():
    rails = [f"su1-r{r}" for r in range(1, 9)]
    rails2 = [f"su2-r{r}" for r in range(1, 9)]
    spec = tree_spec(
        {"a1": rails, "a2": rails, "b1": rails2, "b2": rails2},
        {leaf: ["S1", "S2"] for leaf in rails + rails2},
    )
    domains = compute_domains(spec)
    assert domains["a1"] == domains["a2"] == NodeDomains("su1-r1..su1-r8", "S1..S2")
    assert domains["b1"].leaf == "su2-r1..su2-r8"


def test_a_missing_rail_cable_does_not_split_the_scalable_unit():
    rails = [f"r{r}" for r in range(1, 5)]
    spec = tree_spec({"a1": rails, "a2": rails[:3]}, {})
    assert compute_domains(spec)["a2"].leaf == compute_domains(spec)["a1"].leaf == "r1..r4"


def test_leaves_with_nothing_above_are_their_own_spine_domain():
    spec = tree_spec({"n1": ["L1"], "n2": ["L2"]}, {})
    assert compute_domains(spec)["n2"] == NodeDomains("L2", "L2")


def test_an_uncabled_host_is_an_error():
    spec = tree_spec({"n1": ["L1"]}, {})
    broken = type(spec)(spec.kind, spec.switches, spec.hcas, (), spec.gpus_per_node)
    with pytest.raises(ValueError, match="n1 is not cabled"):
        compute_domains(broken)


def test_dragonfly_leaf_is_a_router_and_spine_its_group():
    domains = compute_domains(dragonfly(a=2, p=2, h=1))
    assert domains["node01"] == NodeDomains("g01-r01", "g01")
    assert domains["node03"] == NodeDomains("g01-r02", "g01")
    assert domains["node05"] == NodeDomains("g02-r01", "g02")


def test_torus_leaf_is_a_router_and_spine_the_aligned_sub_box():
    spec = torus(8, 4, 2)  # sub-box 4x4x4 clipped to 4x4x2
    domains = compute_domains(spec)
    node = next(h for h, d in domains.items() if d.coords == (5, 1, 1))
    assert domains[node] == NodeDomains("r5-1-1", "box-1-0-0", (5, 1, 1))
    assert len({d.spine for d in domains.values()}) == 2


def test_summary_of_a_hand_checked_oversubscribed_fat_tree():
    # Two leaves, 4 hosts each at 100 Gb/s down, 2 x 100 Gb/s up to one spine each leaf:
    # leaf down 800, up 400 -> 2:1.
    hosts = {f"n{i}": ["L1" if i <= 4 else "L2"] for i in range(1, 9)}
    spec = tree_spec(hosts, {"L1": ["S1", "S1"], "L2": ["S1", "S1"]}, gpus_per_node=4)
    summary = summarise(spec)
    assert summary == {
        "kind": "fat-tree",
        "levels": ["node", "leaf", "spine", "fabric"],
        "domain_counts": {"node": 8, "leaf": 2, "spine": 1, "fabric": 1},
        "gpus": 32,
        "switches_per_tier": {"leaf": 2, "spine": 1},
        "link_rates_gbps": {100: 12},
        "rail_optimised": False,
        "oversubscription": {"leaf:spine": 2.0},
    }


def test_summary_states_spine_to_core_oversubscription():
    spec = tree_spec({"n1": ["L1"], "n2": ["L1"], "n3": ["L2"], "n4": ["L2"]},
                     {"L1": ["S1", "S1"], "L2": ["S2", "S2"], "S1": ["C1"], "S2": ["C1"]},
                     host_gbps=200, uplink_gbps=200)
    assert summarise(spec)["oversubscription"] == {"leaf:spine": 1.0, "spine:core": 2.0}


def test_summary_of_generated_fabrics():
    assert summarise(fat_tree(64, 8, tiers=3))["oversubscription"] == {
        "leaf:spine": 1.0, "spine:core": 1.0}
    assert summarise(dragonfly(4, 2, 2))["oversubscription"] == {"router:global": 1.0}
    assert summarise(fat_tree(16, 16, rails=8))["rail_optimised"] is True


def test_torus_summary_states_dimensions_and_sub_box():
    summary = summarise(torus(8, 8, 2, hosts_per_router=2))
    assert (summary["torus_dims"], summary["sub_box"]) == ((8, 8, 2), (4, 4, 2))
    assert summary["domain_counts"] == {"node": 256, "leaf": 128, "spine": 4, "fabric": 1}

from collections import Counter

import pytest

from fabric.core.generators import dragonfly, fat_tree, torus
from fabric.core.levels import compute_domains


def guids_unique(spec):
    guids = [s.guid for s in spec.switches] + [h.guid for h in spec.hcas]
    return len(set(guids)) == len(guids)


def ports_in_use(spec):
    used = Counter()
    for link in spec.links:
        used[link.a_guid] += 1
        used[link.b_guid] += 1
    return used


def test_generators_are_deterministic():
    assert fat_tree(100, 16, tiers=3) == fat_tree(100, 16, tiers=3)
    assert dragonfly(4, 2, 2) == dragonfly(4, 2, 2)
    assert torus(4, 4, 4) == torus(4, 4, 4)


def test_two_tier_fat_tree_uses_half_the_radix_down_and_half_up():
    spec = fat_tree(20, 8)  # 4 hosts per leaf -> 5 leaves, 4 spines
    tiers = Counter(s.tier for s in spec.switches)
    assert tiers == {"leaf": 5, "spine": 4}
    assert len(spec.links) == 20 + 5 * 4
    assert max(ports_in_use(spec).values()) <= 8
    assert spec.hosts[:2] == ["node01", "node02"] and spec.hosts[-1] == "node20"


def test_three_tier_fat_tree_groups_leaves_into_pods():
    spec = fat_tree(40, 8, tiers=3)  # 10 leaves -> 3 pods of up to 4 leaves, 16 cores
    tiers = Counter(s.tier for s in spec.switches)
    assert tiers == {"leaf": 10, "spine": 12, "core": 16}
    assert len({d.spine for d in compute_domains(spec).values()}) == 3
    assert max(ports_in_use(spec).values()) <= 8
    assert guids_unique(spec)


def test_rail_optimised_fat_tree_gives_every_host_one_hca_per_rail():
    spec = fat_tree(16, 16, rails=8)
    assert Counter(h.host for h in spec.hcas)["node01"] == 8
    assert spec.kind == "rail-optimised"
    assert len({d.leaf for d in compute_domains(spec).values()}) == 2


def test_fat_tree_rejects_more_nodes_than_the_radix_allows():
    with pytest.raises(ValueError, match="allows 8"):
        fat_tree(33, 8)


def test_host_names_are_zero_padded_to_the_node_count():
    assert fat_tree(1000, 64, tiers=3).hosts[0] == "node0001"


def test_balanced_dragonfly_joins_every_pair_of_groups_with_one_global_link():
    spec = dragonfly(a=4, p=2, h=2)  # 9 groups of 4 routers, 72 hosts
    group = {s.guid: s.group for s in spec.switches}
    pairs = Counter(
        tuple(sorted((group[link.a_guid], group[link.b_guid])))
        for link in spec.links
        if link.a_guid in group and link.b_guid in group and group[link.a_guid] != group[link.b_guid]
    )
    assert len(pairs) == 9 * 8 // 2 and set(pairs.values()) == {1}
    assert len(spec.hosts) == 72
    assert set(ports_in_use(spec)[s.guid] for s in spec.switches) == {2 + 3 + 2}


def test_torus_routers_have_six_neighbours_with_wrap_around():
    spec = torus(3, 4, 5, hosts_per_router=2)
    used = ports_in_use(spec)
    assert {used[s.guid] for s in spec.switches} == {2 + 6}
    assert len(spec.hosts) == 120 and spec.torus_dims == (3, 4, 5)


def test_torus_rings_of_two_and_one_get_one_cable_and_none():
    spec = torus(2, 1, 1)
    assert len([x for x in spec.links if x.a_guid in spec.switch_by_guid()]) == 1

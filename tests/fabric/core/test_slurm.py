import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.core.errors import FabricFormatError
from fabric.core.generators import dragonfly, fat_tree, torus
from fabric.core.levels import NodeDomains, compute_domains
from fabric.core.slurm import export_slurm_block, export_slurm_tree, parse_slurm_topology

SLURM_DOC_EXAMPLE = """\
# topology.conf from the Slurm documentation
SwitchName=s0 Nodes=tux[0-3] LinkSpeed=900
SwitchName=s1 Nodes=tux[4-7] LinkSpeed=900
SwitchName=s2 Nodes=tux[8-11] LinkSpeed=900
SwitchName=s3 Switches=s[0-2] LinkSpeed=1800
"""


def leaf_and_spine(domains):
    return {host: (d.leaf, d.spine) for host, d in domains.items()}


def partition(domains, level):
    groups = {}
    for host, d in domains.items():
        groups.setdefault(getattr(d, level), set()).add(host)
    return sorted(sorted(g) for g in groups.values())


def error_of(text, path="site/topology.conf"):
    with pytest.raises(FabricFormatError) as caught:
        parse_slurm_topology(text, path=path)
    return str(caught.value)


# --- parsing ------------------------------------------------------------------------------


def test_tree_leaves_are_switches_with_nodes_and_spine_is_their_parent():
    domains = compute_domains(parse_slurm_topology(SLURM_DOC_EXAMPLE))
    assert domains["tux0"] == NodeDomains("s0", "s3")
    assert domains["tux11"] == NodeDomains("s2", "s3")
    assert len(domains) == 12


def test_link_speed_becomes_the_link_rate():
    spec = parse_slurm_topology(SLURM_DOC_EXAMPLE)
    assert {link.rate_gbps for link in spec.links} == {900.0, 1800.0}


def test_keys_are_case_insensitive_and_lines_may_continue():
    text = "switchname=a nodes=n[1-2]\nSWITCHNAME=b \\\n  Switches=a\n"
    assert compute_domains(parse_slurm_topology(text))["n1"] == NodeDomains("a", "b")


def test_guids_are_synthesised_stably_from_names():
    first = parse_slurm_topology(SLURM_DOC_EXAMPLE)
    again = parse_slurm_topology("\n\n" + SLURM_DOC_EXAMPLE)
    assert first == again
    guids = [s.guid for s in first.switches] + [h.guid for h in first.hcas]
    assert len(set(guids)) == len(guids)


def test_elements_remember_their_source_line():
    spec = parse_slurm_topology(SLURM_DOC_EXAMPLE)
    assert {s.name: s.line for s in spec.switches} == {"s0": 2, "s1": 3, "s2": 4, "s3": 5}


def test_a_leaf_under_two_spines_joins_both_into_one_spine_domain():
    text = (
        "SwitchName=l1 Nodes=n[1-2]\nSwitchName=l2 Nodes=n[3-4]\nSwitchName=l3 Nodes=n[5-6]\n"
        "SwitchName=s1 Switches=l[1-2]\nSwitchName=s2 Switches=l[1-2]\nSwitchName=s3 Switches=l3\n"
        "SwitchName=top Switches=s[1-3]\n"
    )
    domains = compute_domains(parse_slurm_topology(text))
    assert domains["n1"].spine == domains["n4"].spine == "s1..s2"
    assert domains["n5"].spine == "s3"


def test_block_file_gives_blocks_as_leaves_and_aggregates_as_spines():
    text = (
        "BlockName=b1 Nodes=gpu[001-004]\nBlockName=b2 Nodes=gpu[005-008]\n"
        "BlockName=b3 Nodes=gpu[009-012]\nBlockName=b4 Nodes=gpu[013-016]\nBlockSizes=4,8\n"
    )
    domains = compute_domains(parse_slurm_topology(text))
    assert domains["gpu001"] == NodeDomains("b1", "b1..b2")
    assert domains["gpu016"] == NodeDomains("b4", "b3..b4")


def test_block_file_without_larger_sizes_makes_each_block_its_own_spine():
    text = "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[3-4]\nBlockSizes=2\n"
    assert compute_domains(parse_slurm_topology(text))["n3"] == NodeDomains("b2", "b2")


# --- bad files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n",
         "site/topology.conf:2: duplicate switch 'a' (first on line 1)"),
        ("SwitchName=a Nodes=n1\n\nSwitchName=b Switches=a,c\n",
         "site/topology.conf:3: switch 'b' lists unknown switch 'c'"),
        ("SwitchName=a Nodes=n1\nSwitchName=b Switches=a,c\nSwitchName=c Switches=b\n",
         "site/topology.conf:3: cycle in the switch tree: b -> c -> b"),
        ("SwitchName=a Nodes=n1 Switches=a\n",
         "site/topology.conf:1: cycle in the switch tree: a -> a"),
        ("# header\nSwitchName=a Nodes=node[01-04\n",
         "site/topology.conf:2: malformed hostlist: unclosed '[' in hostlist 'node[01-04'"),
        ("SwitchName=a Nodes=node[04-01]\n",
         "site/topology.conf:1: malformed hostlist: descending range '04-01' in hostlist 'node[04-01]'"),
        ("SwitchName a Nodes=n1\n",
         "site/topology.conf:1: malformed line: expected KEY=VALUE, got 'SwitchName'"),
        ("SwitchName=a Nodes=n1 Colour=red\n", "site/topology.conf:1: unknown key 'Colour'"),
        ("Nodes=n1 SwitchName=a\n",
         "site/topology.conf:1: a line must start with SwitchName=, BlockName= or BlockSizes=, not Nodes="),
        ("SwitchName=a Nodes=n[1-2],n2\n", "site/topology.conf:1: 'n2' listed twice"),
        ("SwitchName=a Nodes=n1 LinkSpeed=fast\n",
         "site/topology.conf:1: LinkSpeed must be a number from 0.1 to 100000 (Gb/s), not 'fast'"),
        # found by the importer fuzzer (2026-11-30): these reached the database and failed there
        ("SwitchName=a Nodes=n1 LinkSpeed=9999999999\n",
         "site/topology.conf:1: LinkSpeed must be a number from 0.1 to 100000 (Gb/s), "
         "not '9999999999'"),
        ("SwitchName=a Nodes=n1 LinkSpeed=nan\n",
         "site/topology.conf:1: LinkSpeed must be a number from 0.1 to 100000 (Gb/s), not 'nan'"),
        ("SwitchName=" + "s" * 65 + " Nodes=n1\n",
         "site/topology.conf:1: switch name 'ssssssssssssssssssss'... is longer than 64 characters"),
        ("SwitchName=a Nodes=" + "n" * 65 + "\n",
         "site/topology.conf:1: node name 'nnnnnnnnnnnnnnnnnnnn'... is longer than 64 characters"),
        ("BlockName=" + "b" * 65 + " Nodes=n1\n",
         "site/topology.conf:1: block name 'bbbbbbbbbbbbbbbbbbbb'... is longer than 64 characters"),
        ("SwitchName=a Nodes=n1 LinkSpeed=1e309\n",
         "site/topology.conf:1: LinkSpeed must be a number from 0.1 to 100000 (Gb/s), not '1e309'"),
        ("SwitchName=a Nodes=n1\nBlockName=b Nodes=n2\n",
         "site/topology.conf:2: mixes tree (SwitchName) and block records"),
        ("BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[2-3]\n",
         "site/topology.conf:2: node 'n2' is already in block 'b1'"),
        ("BlockName=b1 Nodes=n1\nBlockName=b1 Nodes=n2\n",
         "site/topology.conf:2: duplicate block 'b1' (first on line 1)"),
        ("BlockName=b1 Nodes=n1\nBlockSizes=4,12\n",
         "site/topology.conf:2: each BlockSizes value must be a power-of-two multiple (>1) "
         "of the previous one, not 4 then 12"),
        ("BlockName=b1 Nodes=n1 Switches=s1\n",
         "site/topology.conf:1: Switches= is not allowed on a BlockName line"),
        ("# nothing here\n", "site/topology.conf:1: no SwitchName or BlockName records"),
    ],
)
def test_bad_files_are_rejected_with_path_and_line(text, expected):
    assert error_of(text) == expected


# --- export -------------------------------------------------------------------------------


def test_tree_export_writes_leaf_spine_and_top_switches_with_compressed_hostlists():
    domains = {
        "node01": NodeDomains("leafA", "spineX"),
        "node02": NodeDomains("leafA", "spineX"),
        "node03": NodeDomains("leafB", "spineX"),
        "node10": NodeDomains("leafC", "spineY"),
    }
    assert export_slurm_tree(domains) == (
        "# topology.conf (topology/tree) written by IBEX\n"
        "SwitchName=leafA Nodes=node[01-02]\n"
        "SwitchName=leafB Nodes=node03\n"
        "SwitchName=spineX Switches=leafA,leafB\n"
        "SwitchName=leafC Nodes=node10\n"
        "SwitchName=spineY Switches=leafC\n"
        "SwitchName=fabric Switches=spineX,spineY\n"
    )


def test_tree_export_of_a_spec_states_the_common_link_speed():
    text = export_slurm_tree(fat_tree(8, 8, tiers=2, rate_gbps=400))
    assert "SwitchName=leaf01 Nodes=node[01-04] LinkSpeed=400" in text


def test_block_export_writes_blocks_per_spine_and_block_sizes():
    text = export_slurm_block(fat_tree(32, 8, tiers=3))
    assert text.splitlines()[1] == "BlockName=leaf01 Nodes=node[01-04]"
    assert text.splitlines()[-1] == "BlockSizes=4,16"


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [fat_tree(40, 8, tiers=3), fat_tree(16, 8, tiers=2), fat_tree(16, 16, tiers=2, rails=8),
     dragonfly(2, 2, 1), torus(4, 4, 8)],
    ids=["fat-tree-3", "fat-tree-2", "rail-optimised", "dragonfly", "torus"],
)
def test_generated_fabric_survives_tree_export_and_import(spec):
    before = compute_domains(spec)
    after = compute_domains(parse_slurm_topology(export_slurm_tree(spec)))
    assert leaf_and_spine(after) == leaf_and_spine(before)


def test_parsed_file_survives_export_and_import():
    text = (
        "SwitchName=l1 Nodes=n[01-02]\nSwitchName=l2 Nodes=n[03-04]\nSwitchName=l3 Nodes=n[05-09]\n"
        "SwitchName=s1 Switches=l[1-2]\nSwitchName=s2 Switches=l[1-2]\nSwitchName=s3 Switches=l3\n"
        "SwitchName=top Switches=s[1-3]\n"
    )
    first = compute_domains(parse_slurm_topology(text))
    second = compute_domains(parse_slurm_topology(export_slurm_tree(first)))
    assert second == first


def test_single_leaf_fabric_survives_export_and_import():
    first = compute_domains(parse_slurm_topology("SwitchName=only Nodes=n[1-3]\n"))
    assert compute_domains(parse_slurm_topology(export_slurm_tree(first))) == first


@pytest.mark.parametrize(
    "spec", [fat_tree(32, 8, tiers=3), dragonfly(2, 2, 1), fat_tree(32, 16, tiers=3, rails=8)],
    ids=["fat-tree-3", "dragonfly", "rail-optimised"],
)
def test_block_export_and_import_keep_the_same_groups(spec):
    before = compute_domains(spec)
    after = compute_domains(parse_slurm_topology(export_slurm_block(spec)))
    assert {h: d.leaf for h, d in after.items()} == {h: d.leaf for h, d in before.items()}
    assert partition(after, "spine") == partition(before, "spine")


def test_block_file_survives_export_and_import():
    text = "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[3-4]\nBlockSizes=2,4\n"
    first = compute_domains(parse_slurm_topology(text))
    assert compute_domains(parse_slurm_topology(export_slurm_block(first))) == first


def test_a_node_listed_under_several_leaf_switches_joins_them_into_one_leaf_domain():
    text = (
        "SwitchName=su1-rail1 Nodes=dgx[01-04]\nSwitchName=su1-rail2 Nodes=dgx[01-04]\n"
        "SwitchName=su2-rail1 Nodes=dgx[05-08]\nSwitchName=su2-rail2 Nodes=dgx[05-08]\n"
        "SwitchName=spine Switches=su[1-2]-rail1,su[1-2]-rail2\n"
    )
    spec = parse_slurm_topology(text)
    assert len([h for h in spec.hcas if h.host == "dgx01"]) == 2
    domains = compute_domains(spec)
    assert domains["dgx04"] == NodeDomains("su1-rail1..su1-rail2", "spine")
    assert domains["dgx05"].leaf == "su2-rail1..su2-rail2"
    assert compute_domains(parse_slurm_topology(export_slurm_tree(domains))) == domains


def test_leaves_without_spines_stay_apart_from_the_rest_after_export_and_import():
    text = (
        "SwitchName=l1 Nodes=n1\nSwitchName=l2 Nodes=n2\nSwitchName=l3 Nodes=n3\n"
        "SwitchName=s1 Switches=l1\nSwitchName=s2 Switches=l2\n"
    )
    first = compute_domains(parse_slurm_topology(text))
    assert first["n3"] == NodeDomains("l3", "l3")
    assert compute_domains(parse_slurm_topology(export_slurm_tree(first))) == first


_layouts = st.lists(st.tuples(st.integers(1, 6), st.integers(1, 3)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(_layouts)
def test_any_two_level_layout_survives_tree_export_and_import(layout):
    # host i sits under leaf "leaf<a>" of spine "spine<b>"; a leaf keeps the spine of its first host.
    spine_of_leaf = {}
    domains = {}
    for index, (leaf, spine) in enumerate(layout, start=1):
        spine_of_leaf.setdefault(leaf, spine)
        domains[f"host{index:03d}"] = NodeDomains(f"leaf{leaf}", f"spine{spine_of_leaf[leaf]}")
    assert compute_domains(parse_slurm_topology(export_slurm_tree(domains))) == domains

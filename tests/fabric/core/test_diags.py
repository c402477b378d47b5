"""Reading the live fabric from ibnetdiscover and perfquery output (captured under ibsim)."""

import pytest

from fabric.core.diags import (
    DiagsFormatError,
    link_key,
    merge_counters,
    parse_discovery,
    parse_perfquery,
)
from fabric.core.fabric_report import topology_hash, topology_section
from fabric.core.generators import fat_tree
from fabric.core.netfile import ibsim_netfile
from tests.fabric.core.diags_samples import IBNETDISCOVER, PERFQUERY, PERFQUERY_EXTENDED

SPEC = fat_tree(4, 4, rate_gbps=100)
NAMES = {s.name: s.guid for s in SPEC.switches}


def test_the_discovery_lists_every_node_with_its_lid():
    discovery = parse_discovery(IBNETDISCOVER)

    assert len(discovery.nodes) == 8
    leaf01 = discovery.nodes[NAMES["leaf01"]]
    assert (leaf01.kind, leaf01.description, leaf01.lid, leaf01.ports) == ("switch", "leaf01", 1, 4)
    node01 = next(n for n in discovery.nodes.values() if n.description == "node01 mlx5_0")
    assert (node01.kind, node01.lid) == ("ca", 4)


def test_each_cable_is_kept_once_whichever_end_lists_it_and_the_unlinked_one_is_missing():
    discovery = parse_discovery(IBNETDISCOVER)

    keys = {link.key for link in discovery.links}
    expected = {link_key(c.a_guid, c.a_port, c.b_guid, c.b_port) for c in SPEC.links}
    unlinked = link_key(NAMES["leaf01"], 3, NAMES["spine01"], 1)
    assert keys == expected - {unlinked}
    assert {(link.rate_gbps, link.width) for link in discovery.links} == {(100.0, "4x")}


def test_the_cabled_ports_of_a_node_are_those_with_a_cable_up():
    ports = parse_discovery(IBNETDISCOVER).cabled_ports()

    assert ports[NAMES["leaf01"]] == [1, 2, 4]


def test_a_line_that_is_not_ibnetdiscover_output_is_refused():
    with pytest.raises(DiagsFormatError, match="line 2"):
        parse_discovery('Switch 4 "S-0000000000000001"\nibwarn: something odd\n')


def test_perfquery_blocks_are_read_per_lid_and_port():
    basic = parse_perfquery(PERFQUERY)
    extended = parse_perfquery(PERFQUERY_EXTENDED)

    assert set(basic) == {(1, 1), (1, 3)}
    assert basic[(1, 1)]["extended"] is False and extended[(1, 1)]["extended"] is True
    assert set(basic[(1, 1)]) >= {"xmit_data", "rcv_data", "symbol_errors", "link_downed",
                                   "rcv_errors", "xmit_discards"}


def test_merged_counters_take_errors_from_the_basic_block_and_data_from_the_extended():
    merged = merge_counters({"xmit_data": 4294967295, "symbol_errors": 7},
                            {"xmit_data": 123456789012, "rcv_data": 5, "extended": True})

    assert merged["xmit_data"] == 123456789012 and merged["rcv_data"] == 5
    assert merged["symbol_errors"] == 7 and merged["extended"] is True


def test_a_counter_that_is_not_a_number_is_refused():
    with pytest.raises(DiagsFormatError, match="PortXmitData"):
        parse_perfquery("# Port counters: Lid 1 port 1 (CapMask: 0x1300)\nPortXmitData:....x\n")


def test_the_topology_hash_changes_with_a_cable_and_not_with_the_order_of_records():
    discovery = parse_discovery(IBNETDISCOVER)
    records = IBNETDISCOVER.split("\n\n")
    reordered = parse_discovery("\n\n".join(reversed(records)))
    fewer = parse_discovery(IBNETDISCOVER.replace(
        '[4]\t"S-3b297347936cc9ab"[1]\t\t# "spine02" lid 6 4xEDR\n', "").replace(
        '[1]\t"S-afae13cdc276c25b"[4]\t\t# "leaf01" lid 1 4xEDR\n', ""))

    assert topology_hash(topology_section(reordered)) == topology_hash(topology_section(discovery))
    assert topology_hash(topology_section(fewer)) != topology_hash(topology_section(discovery))


def test_the_net_file_names_every_node_by_its_guid_and_every_cable_from_both_ends():
    text = ibsim_netfile(SPEC)

    assert f"switchguid={NAMES['leaf01']}\nSwitch\t4\t\"leaf01\"" in text
    assert '[3]\t"spine01"[1]\t# lid 0 4xEDR' in text
    assert '"node01 mlx5_0"' in text and text.count("caguid=") == 4
    assert text.count("4xEDR") == 2 * len(SPEC.links)


def test_links_faster_than_ibsim_knows_are_simulated_as_edr():
    assert "4xEDR" in ibsim_netfile(fat_tree(4, 4, rate_gbps=400))
    assert "4xQDR" in ibsim_netfile(fat_tree(4, 4, rate_gbps=40))

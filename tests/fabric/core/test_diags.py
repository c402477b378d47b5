"""Reading the live fabric from ibnetdiscover and perfquery output (captured under ibsim)."""

import pytest

from fabric.core.diags import (
    DiagsFormatError,
    LiveLink,
    link_key,
    link_state,
    merge_counters,
    parse_discovery,
    parse_ibqueryerrors,
    parse_linkinfo,
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


# ibqueryerrors, as it prints under ibsim: a switch's ports by its node GUID; a CA's by its node
# GUID in the data listing and by its port GUID in the error listing.
QUERYERRORS_DATA = """\
Data Counters for 0xedc768b3fcc6a141 "node01 mlx5_0"
   GUID 0xedc768b3fcc6a141 port 1: [PortXmitData == 1584 (6.188KB)] [PortRcvData == 1656 (6.469KB)] [PortXmitPkts == 22 (22.000)]
Data Counters for 0xafae13cdc276c25b "leaf01"
   GUID 0xafae13cdc276c25b port 3: [PortXmitData == 123456791892 (459.912GB)] [PortRcvData == 8640 (33.750KB)]

## Summary: 8 nodes checked, 0 bad nodes found
##          16 ports checked, 0 ports have errors beyond threshold
"""
QUERYERRORS_ERRORS = """\
Errors for "node01 mlx5_0"
   GUID 0xedc768b3fcc6a142 port 1: [PortRcvErrors == 3]
Errors for 0xafae13cdc276c25b "leaf01"
   GUID 0xafae13cdc276c25b port ALL: [SymbolErrorCounter == 1]
   GUID 0xafae13cdc276c25b port 1: [SymbolErrorCounter == 1]

## Summary: 8 nodes checked, 2 bad nodes found
"""
PORT_GUIDS = {"0xedc768b3fcc6a142": "0xedc768b3fcc6a141"}


def test_ibqueryerrors_data_counters_are_read_per_node_and_port():
    data = parse_ibqueryerrors(QUERYERRORS_DATA, PORT_GUIDS)

    assert data[("0xafae13cdc276c25b", 3)] == {"xmit_data": 123456791892, "rcv_data": 8640}
    assert data[("0xedc768b3fcc6a141", 1)]["xmit_data"] == 1584


def test_ibqueryerrors_errors_of_a_ca_port_are_its_nodes_and_the_all_line_is_skipped():
    errors = parse_ibqueryerrors(QUERYERRORS_ERRORS, PORT_GUIDS)

    assert errors == {("0xedc768b3fcc6a141", 1): {"rcv_errors": 3},
                      ("0xafae13cdc276c25b", 1): {"symbol_errors": 1}}


def test_an_ibqueryerrors_run_cut_short_is_refused():
    with pytest.raises(DiagsFormatError, match="summary"):
        parse_ibqueryerrors(QUERYERRORS_ERRORS.split("##")[0], PORT_GUIDS)


def test_the_discovery_maps_each_ca_port_guid_to_its_node():
    discovery = parse_discovery(IBNETDISCOVER)

    node01 = next(n.guid for n in discovery.nodes.values() if n.description == "node01 mlx5_0")
    assert discovery.port_guids[f"0x{int(node01, 16) + 1:016x}"] == node01


LINKINFO = """\
0xedc768b3fcc6a142 "                 node01 mlx5_0"      4    1[  ] ==( 4X      25.78125 Gbps Active/  LinkUp)==>  0xafae13cdc276c25b      1    1[  ] "leaf01" (Could be 12X Could be 53.125 Gbps)
0xafae13cdc276c25b "                        leaf01"      1    3[  ] ==( 4X      25.78125 Gbps Initialize/  LinkUp)==>  0x0c2ddf5aea40842d      3    1[  ] "spine01" (Could be 12X Could be 53.125 Gbps)
0x0c2ddf5aea40842d "                       spine01"      3    1[  ] ==( 4X      25.78125 Gbps Active/  LinkUp)==>  0xafae13cdc276c25b      1    3[  ] "leaf01" ( )
"""


def test_iblinkinfo_gives_each_port_its_logical_state_by_node_guid():
    states = parse_linkinfo(LINKINFO, PORT_GUIDS)

    assert states == {("0xedc768b3fcc6a141", 1): "active", ("0xafae13cdc276c25b", 3): "init",
                      ("0x0c2ddf5aea40842d", 1): "active"}


def test_a_cable_is_as_up_as_its_less_up_end():
    states = parse_linkinfo(LINKINFO, PORT_GUIDS)
    uplink = LiveLink("0x0c2ddf5aea40842d", 1, "0xafae13cdc276c25b", 3, 100.0, "4x")
    unknown = LiveLink("0x0000000000000001", 1, "0x0000000000000002", 1, 100.0, "4x")

    assert link_state(states, uplink) == "init"
    assert link_state(states, unknown) == "active"

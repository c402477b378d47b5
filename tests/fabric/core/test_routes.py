"""Forwarding tables read from dump_fts, sent compactly, and traced into directed links."""

import pytest

from fabric.core.diags import parse_dump_fts
from fabric.core.fabric_report import routes_section
from fabric.core.routes import RouteBroken, RouteMap, decode_table, encode_table

DUMP_FTS = """\
Unicast lids [0x0-0x4] of switch DR path slid 0; dlid 0; 0 guid 0x000000000000000a (leaf01):
  Lid  Out   Destination
       Port     Info
0x0001 000
0x0002 001
0x0003 003
0x0004 003
4 valid lids dumped
Unicast lids [0x0-0x4] of switch DR path slid 0; dlid 0; 0,3 guid 0x000000000000000b (spine01):
  Lid  Out   Destination
       Port     Info
0x0001 001
0x0002 001
0x0003 001
0x0004 002
4 valid lids dumped
Unicast lids [0x0-0x4] of switch DR path slid 0; dlid 0; 0,3,2 guid 0xc (leaf02):
  Lid  Out   Destination
       Port     Info
0x0002 003 : (Channel Adapter portguid 0x0000000000000002: 'a mlx5_0')
0x0004 001 : (Channel Adapter portguid 0x0000000000000004: 'b mlx5_0')
"""
A, B = "0x0000000000000001", "0x0000000000000003"
LEAF1, SPINE, LEAF2 = "0x000000000000000a", "0x000000000000000b", "0x000000000000000c"


def route_map(down=()):
    tables = parse_dump_fts(DUMP_FTS)
    cables = [((A, 1), (LEAF1, 1)), ((LEAF1, 3), (SPINE, 1)), ((SPINE, 2), (LEAF2, 3)),
              ((B, 1), (LEAF2, 1))]
    peers = {}
    for here, there in cables:
        peers[here], peers[there] = there, here
    return RouteMap(lids={A: 2, B: 4, LEAF1: 1, SPINE: 3},
                    tables={guid: decode_table(encode_table(t)) for guid, t in tables.items()},
                    peers=peers, host_ports={"a": (A, 1), "b": (B, 1)}, down=set(down),
                    names={LEAF1: "leaf01", SPINE: "spine01", LEAF2: "leaf02", A: "a", B: "b"})


def test_dump_fts_gives_each_switch_its_lid_to_port_table():
    tables = parse_dump_fts(DUMP_FTS)

    assert tables[LEAF1] == {1: 0, 2: 1, 3: 3, 4: 3}
    assert tables[LEAF2] == {2: 3, 4: 1}
    assert set(tables) == {LEAF1, SPINE, LEAF2}


def test_a_table_travels_as_two_hex_digits_a_lid_with_ff_where_there_is_no_route():
    assert encode_table({1: 0, 3: 17}) == "ff00ff11"
    assert list(decode_table("ff00ff11")) == [255, 0, 255, 17]
    section = routes_section(parse_dump_fts(DUMP_FTS), {A: 2, B: 4})
    assert section["switches"][SPINE] == "ff01010102" and section["lids"] == {A: 2, B: 4}


def test_the_path_follows_each_switch_table_to_the_destination_hca():
    route = route_map()

    hops = route.path("a", "b")

    assert hops == [(A, 1), (LEAF1, 3), (SPINE, 2), (LEAF2, 1)]
    assert [route.name(hop) for hop in hops] == [
        "a port 1 → leaf01", "leaf01 port 3 → spine01", "spine01 port 2 → leaf02",
        "leaf02 port 1 → b"]


def test_a_route_over_a_link_that_is_down_is_broken_at_that_link():
    route = route_map(down={(LEAF1, 3)})

    with pytest.raises(RouteBroken) as broken:
        route.path("a", "b")

    assert broken.value.at == (LEAF1, 3) and "leaf01 port 3 → spine01 is down" in str(broken.value)


def test_a_ring_over_two_hosts_crosses_the_routes_both_ways():
    route = route_map()

    assert route.ring(["a", "b"]) == [("a", "b"), ("b", "a")]
    assert (SPINE, 1) in route.ring_links(["a", "b"]) and (SPINE, 2) in route.ring_links(["a", "b"])

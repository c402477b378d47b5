from pathlib import Path

import pytest

from fabric.core.errors import FabricFormatError
from fabric.core.generators import fat_tree
from fabric.core.ibnetdiscover import host_of_description, parse_ibnetdiscover
from fabric.core.levels import NodeDomains, compute_domains
from tests.fabric.ibnetdiscover_text import render_ibnetdiscover

SAMPLE_PATH = Path(__file__).parent.parent / "data" / "two_leaves_two_spines.ibnetdiscover"
SAMPLE = SAMPLE_PATH.read_text()


def parse_sample():
    return parse_ibnetdiscover(SAMPLE, path="fabric.txt")


def line_of(text, fragment):
    """1-based number of the first line containing fragment."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def error_of(text):
    with pytest.raises(FabricFormatError) as caught:
        parse_ibnetdiscover(text, path="fabric.txt")
    return str(caught.value)


def test_switches_are_named_from_their_node_description():
    spec = parse_sample()
    assert sorted(s.name for s in spec.switches) == ["leaf01", "leaf02", "spine01", "spine02"]
    assert {s.guid for s in spec.switches} >= {"0x7cfe900300a00001", "0x7cfe900300b00002"}
    assert {s.ports for s in spec.switches} == {64}


def test_hosts_are_the_first_word_of_the_ca_description():
    assert [(h.host, h.guid, h.port) for h in parse_sample().hcas] == [
        ("node01", "0xb8599f0300e10001", 1),
        ("node02", "0xb8599f0300e10002", 1),
        ("node03", "0xb8599f0300e10003", 1),
    ]


def test_ca_with_factory_description_names_no_host_and_is_left_out():
    spec = parse_sample()
    assert "0xb8599f0300e10004" not in {h.guid for h in spec.hcas}
    assert "0xb8599f0300e10004" not in {link.a_guid for link in spec.links}
    assert host_of_description("MT4129 ConnectX7 Mellanox Technologies") is None
    assert host_of_description("node07 mlx5_3") == "node07"


def test_each_cable_listed_from_both_ends_becomes_one_link_with_its_rate():
    spec = parse_sample()
    # 4 leaf-spine cables + 3 named hosts (the factory-description CA is dropped)
    assert len(spec.links) == 7
    host_link = next(link for link in spec.links if link.a_guid == "0xb8599f0300e10001")
    assert (host_link.b_guid, host_link.b_port, host_link.rate_gbps, host_link.width) == (
        "0x7cfe900300b00001", 1, 400.0, "4x")
    assert sorted({link.rate_gbps for link in spec.links}) == [200.0, 400.0]


def test_tiers_are_inferred_and_both_spines_form_one_group():
    domains = compute_domains(parse_sample())
    assert domains == {
        "node01": NodeDomains("leaf01", "spine01..spine02"),
        "node02": NodeDomains("leaf01", "spine01..spine02"),
        "node03": NodeDomains("leaf02", "spine01..spine02"),
    }


@pytest.mark.parametrize(
    ("speed", "gbps"),
    [("4xSDR", 10.0), ("4xDDR", 20.0), ("4xQDR", 40.0), ("4xFDR10", 40.0), ("4xFDR", 56.0),
     ("4xEDR", 100.0), ("4xHDR", 200.0), ("2xNDR", 200.0), ("8xNDR", 800.0), ("1xXDR", 200.0),
     ("12xEDR", 300.0)],
)
def test_link_rate_is_width_times_lane_speed(speed, gbps):
    text = SAMPLE.replace("lid 5 4xNDR", f"lid 5 {speed}")
    link = next(x for x in parse_ibnetdiscover(text).links if x.a_guid == "0xb8599f0300e10001")
    assert link.rate_gbps == gbps


def test_rail_optimised_hosts_with_eight_hcas_form_one_leaf_domain_per_scalable_unit():
    generated = fat_tree(16, 16, tiers=2, rails=8)  # 2 units of 8 hosts, 8 leaves per unit
    spec = parse_ibnetdiscover(render_ibnetdiscover(generated))
    assert spec.kind == "rail-optimised"
    assert len([h for h in spec.hcas if h.host == "node01"]) == 8
    domains = compute_domains(spec)
    assert {d.leaf for d in domains.values()} == {"su01-rail1..su01-rail8", "su02-rail1..su02-rail8"}
    assert domains["node08"].leaf == "su01-rail1..su01-rail8"
    assert domains["node09"].leaf == "su02-rail1..su02-rail8"


def test_reimport_gives_identical_spec():
    assert parse_sample() == parse_ibnetdiscover(SAMPLE + "\n# trailing comment\n")


def test_duplicate_guid_is_rejected_at_the_second_record():
    duplicate = (
        "\nswitchguid=0x7cfe900300a00001(7cfe900300a00001)\n"
        'Switch\t64 "S-7cfe900300a00001"\t\t# "MF0;spine09:MQM9700/U1" enhanced port 0 lid 9 lmc 0\n'
    )
    text = SAMPLE + duplicate
    line = len(text.splitlines())
    assert error_of(text) == f"fabric.txt:{line}: duplicate GUID 0x7cfe900300a00001 (first on line 10)"


def test_link_to_an_unknown_switch_is_rejected_at_the_port_line():
    ghost = '[3]\t"S-7cfe9003000fffff"[1]\t\t# "MF0;ghost:MQM9700/U1" lid 9 4xHDR\n'
    text = SAMPLE.replace('# "MF0;leaf02:MQM9700/U1" lid 4 4xHDR\n', '# "MF0;leaf02:MQM9700/U1" lid 4 4xHDR\n' + ghost, 1)
    line = line_of(text, "S-7cfe9003000fffff")
    assert error_of(text) == f"fabric.txt:{line}: link to an unknown node 0x7cfe9003000fffff"


def test_a_port_listed_twice_is_on_two_links():
    text = SAMPLE.replace('[2]\t"H-b8599f0300e10002"', '[1]\t"H-b8599f0300e10002"')
    line = line_of(text, '[1]\t"H-b8599f0300e10002"')
    assert error_of(text) == (
        f"fabric.txt:{line}: port 1 of 0x7cfe900300b00001 is on two links (also line {line - 1})"
    )


def test_ends_that_disagree_put_a_port_on_two_links():
    # leaf01 says its port 2 goes to node02; node02 claims leaf01 port 5 instead.
    text = SAMPLE.replace('"S-7cfe900300b00001"[2]\t', '"S-7cfe900300b00001"[5]\t')
    line = line_of(text, '"S-7cfe900300b00001"[5]')
    assert error_of(text) == f"fabric.txt:{line}: port 1 of 0xb8599f0300e10002 is on two links"


def test_self_link_is_rejected():
    text = SAMPLE.replace('[1]\t"S-7cfe900300b00001"[63]', '[1]\t"S-7cfe900300a00001"[3]')
    line = line_of(text, '"S-7cfe900300a00001"[3]')
    assert error_of(text) == (
        f"fabric.txt:{line}: self link: port 1 of 0x7cfe900300a00001 is cabled to its own port 3"
    )


def test_garbage_line_is_rejected():
    text = SAMPLE.replace("devid=0x1021", "devid 0x1021", 1)
    line = line_of(text, "devid 0x1021")
    assert error_of(text) == f"fabric.txt:{line}: malformed line: 'devid 0x1021'"


def test_port_line_before_any_record_is_rejected():
    assert error_of('[1]\t"S-7cfe900300a00001"[1]\t# "x" lid 1 4xNDR\n') == (
        "fabric.txt:1: port line outside a Switch or Ca record"
    )


def test_port_beyond_the_switch_port_count_is_rejected():
    text = SAMPLE.replace('[64]\t"S-7cfe900300a00002"[1]', '[65]\t"S-7cfe900300a00002"[1]')
    line = line_of(text, "[65]")
    assert error_of(text) == f"fabric.txt:{line}: port 65 outside the 64 ports of 0x7cfe900300b00001"


def test_switches_with_unusable_or_shared_names_fall_back_to_their_guid():
    text = SAMPLE.replace("MF0;spine01:MQM9700/U1", "Quantum Mellanox Technologies").replace(
        "MF0;spine02:MQM9700/U1", "MF0;leaf01:MQM9700/U1")
    names = sorted(s.name for s in parse_ibnetdiscover(text).switches)
    assert names == ["S-7cfe900300a00001", "S-7cfe900300a00002", "S-7cfe900300b00001", "leaf02"]


# --- hostile files, found by the importer fuzzer (2026-11-30) ----------------------------------


def test_a_remote_port_beyond_the_remote_port_count_is_rejected():
    # listed from one end only, so no local check saw it; it used to reach the database
    text = SAMPLE.replace('[63]\t"S-7cfe900300a00001"[1]\t\t# "MF0;spine01:MQM9700/U1" lid 1 4xHDR\n',
                          "").replace('[1]\t"S-7cfe900300b00001"[63]', '[1]\t"S-7cfe900300b00001"[99]')
    line = line_of(text, '"S-7cfe900300b00001"[99]')
    assert error_of(text) == f"fabric.txt:{line}: port 99 outside the 64 ports of 0x7cfe900300b00001"


@pytest.mark.parametrize("ports", ["0", "256", "9" * 5000])
def test_a_port_count_outside_8_bits_is_rejected_not_crashing(ports):
    text = SAMPLE.replace("Switch\t64", f"Switch\t{ports}", 1)
    line = line_of(text, f"Switch\t{ports[:10]}")
    assert error_of(text).startswith(f"fabric.txt:{line}: ")


def test_a_guid_longer_than_64_bits_is_rejected():
    text = SAMPLE.replace("7cfe900300a00001", "f" * 50)
    line = line_of(text, "S-" + "f" * 50)
    assert error_of(text) == (
        f"fabric.txt:{line}: GUID '{'f' * 24}'... is longer than 64 bits")


def test_a_link_width_of_thousands_of_digits_is_no_rate():
    text = SAMPLE.replace("4xNDR", "9" * 5000 + "xNDR", 1)
    assert parse_ibnetdiscover(text, path="fabric.txt").links


@pytest.mark.parametrize("description", ["node" + "x" * 61 + " mlx5_0", "node01 " + "x" * 200])
def test_a_host_name_or_description_too_long_to_store_is_rejected(description):
    text = SAMPLE.replace('"node01 mlx5_0"', f'"{description}"')
    line = line_of(text, 'Ca\t1 "H-b8599f0300e10001"')
    assert error_of(text).startswith(f"fabric.txt:{line}: CA description")


def test_a_switch_name_too_long_to_store_falls_back_to_its_guid():
    text = SAMPLE.replace("MF0;spine01:", "MF0;spine" + "x" * 60 + ":")
    names = sorted(s.name for s in parse_ibnetdiscover(text).switches)
    assert names == ["S-7cfe900300a00001", "leaf01", "leaf02", "spine02"]

"""Bandwidth classes for real: leases placed by IBEX on a fat tree simulated by ibsim, the
fabric agent writing OpenSM's QoS options (opensm.conf) and policy (qos-policy.conf) and
signalling it, and the ports' tables read back with `smpquery vlarb` and `smpquery sl2vl`
and the path records with `saquery`: what OpenSM programmed, not what IBEX meant to."""

import re
import subprocess
import time

import pytest

from fabric.core import qos
from fabric.models import Fabric
from tests.fabric.live import test_partitions_live as partitions_live
from tests.fabric.live.conftest import SPEC_64
from tests.fabric.test_fabric_qos import lease_of_class
from tests.factories import client_for


@pytest.fixture
def fabric_spec():
    """64 hosts, the scale the issue asks the live fabric to be proven at."""
    return SPEC_64


# the partitions' fixtures: a market on the simulated fat tree, and its fabric agent
market, agent = partitions_live.market, partitions_live.agent

pytestmark = pytest.mark.django_db(transaction=True)

APPLIED_WITHIN_S = 15.0


def diag(simulated_fabric, *argv) -> str:
    return subprocess.run(list(argv), env=simulated_fabric.env, capture_output=True, text=True,
                          timeout=10, check=True).stdout


def vlarb(simulated_fabric, lid: int, port: int) -> dict[str, list[tuple[int, int]]]:
    """`smpquery vlarb LID PORT`: each table's (VL, weight) entries, those of weight 0 left out."""
    out = diag(simulated_fabric, "smpquery", "vlarb", str(lid), str(port))
    tables, current, vls = {}, None, []
    for line in out.splitlines():
        if line.startswith("# Low"):
            current = "low"
        elif line.startswith("# High"):
            current = "high"
        elif line.startswith("VL") and current:
            vls = [int(cell, 16) for cell in re.findall(r"0x[0-9a-fA-F]+", line)]
        elif line.startswith("WEIGHT") and current:
            weights = [int(cell, 16) for cell in re.findall(r"0x[0-9a-fA-F]+", line)]
            tables[current] = [(vl, w) for vl, w in zip(vls, weights, strict=True) if w]
    return tables


def sl2vl(simulated_fabric, lid: int, port: int) -> list[list[int]]:
    """`smpquery sl2vl LID PORT`: one row of 16 VLs per input port (one on an HCA)."""
    out = diag(simulated_fabric, "smpquery", "sl2vl", str(lid), str(port))
    return [[int(cell) for cell in line.split(":")[2].split("|") if cell.strip()]
            for line in out.splitlines() if line.startswith("ports:")]


def expected_tables(settings: dict) -> dict:
    return {"high": qos.vlarb_entries(settings["vlarb_high"]),
            "low": qos.vlarb_entries(settings["vlarb_low"])}


def ports_to_read(agent) -> list[tuple[str, int, int]]:
    """A leaf switch's port cabled to an HCA, and that HCA's port: (what, LID, port)."""
    discovery = agent.reader.discovery
    for guid, ports in sorted(discovery.cabled_ports().items()):
        node = discovery.nodes[guid]
        if node.kind != "ca":
            continue
        ca_port = ports[0]
        for (a_guid, a_port), (b_guid, b_port) in discovery_links(discovery):
            if (a_guid, a_port) == (guid, ca_port):
                switch = discovery.nodes[b_guid]
                return [("switch", switch.lid, b_port), ("hca", node.lid, ca_port)]
            if (b_guid, b_port) == (guid, ca_port):
                switch = discovery.nodes[a_guid]
                return [("switch", switch.lid, a_port), ("hca", node.lid, ca_port)]
    raise AssertionError("no HCA cabled to a switch")


def discovery_links(discovery):
    return [((link.a_guid, link.a_port), (link.b_guid, link.b_port))
            for link in discovery.links]


def read_tables(agent, simulated_fabric) -> dict:
    return {what: (vlarb(simulated_fabric, lid, port), sl2vl(simulated_fabric, lid, port))
            for what, lid, port in ports_to_read(agent)}


def wait_for_qos(agent, simulated_fabric, settings) -> dict:
    """Until both ports hold `settings`' tables (OpenSM applies a SIGHUP in about two seconds)."""
    want = expected_tables(settings)
    deadline = time.monotonic() + APPLIED_WITHIN_S
    while True:
        read = read_tables(agent, simulated_fabric)
        if all(tables == want and all(row == qos.sl2vl(settings) for row in rows)
               for tables, rows in read.values()) or time.monotonic() > deadline:
            return read
        time.sleep(0.5)


def path_sl(simulated_fabric, hosts_lids: list[int], pkey: int) -> int:
    """The SL OpenSM's SA answers for a path between the two HCAs in this P_Key."""
    out = diag(simulated_fabric, "saquery", "-p", "--slid", str(hosts_lids[0]), "--dlid",
               str(hosts_lids[1]), "--pkey", f"{0x8000 | pkey:#06x}")
    found = re.search(r"^\s*sl\.+(0x[0-9a-fA-F]+)\s*$", out, re.MULTILINE)
    assert found, out
    return int(found.group(1), 16)


def lids_of(agent, client, lease) -> list[int]:
    hosts = {gpu["node"] for gpu in client.get(f"/api/v1/leases/{lease.pk}/").json()["gpus"]}
    discovery = agent.reader.discovery
    return sorted(node.lid for node in discovery.nodes.values()
                  if node.kind == "ca" and node.description.split()[0] in hosts)


def test_the_agent_programs_ibexs_qos_and_a_guaranteed_lease_gets_its_sl_then_new_weights(
        agent, simulated_fabric, market):
    client, _key = market
    conf_before = simulated_fabric.opensm_conf.read_text()
    guaranteed = lease_of_class(client, {"class": "guaranteed", "gbps_per_gpu": 5})
    standard = lease_of_class(client, {"class": "standard"})
    pkeys = {lease.pk: int(client.get(f"/api/v1/leases/{lease.pk}/").json()["fabric"]["pkey"], 16)
             for lease in (guaranteed, standard)}
    defaults = qos.settings_of({})

    answer = agent.poll_once()
    applied = wait_for_qos(agent, simulated_fabric, defaults)
    policy = (simulated_fabric.osm_dir / "qos-policy.conf").read_text()
    slids = {lease.pk: path_sl(simulated_fabric, lids_of(agent, client, lease), pkeys[lease.pk])
             for lease in (guaranteed, standard)}
    provider = client_for(Fabric.objects.get().owner)
    changed = provider.patch(f"/api/v1/fabrics/{Fabric.objects.get().pk}/", {"qos": {
        "vlarb_high": {"1": 128}, "vlarb_low": {"0": 32, "2": 8}}}, format="json")
    agent.poll_once()
    new_settings = qos.settings_of(Fabric.objects.get().qos)
    reapplied = wait_for_qos(agent, simulated_fabric, new_settings)
    log = (simulated_fabric.osm_dir / "opensm.log").read_text()

    # the defaults: guaranteed SL 1 -> VL 1 (high table), standard SL 0 -> VL 0, scavenger
    # SL 2 -> VL 2 (low table, small weight), on a switch port and an HCA port alike
    assert answer["qos"]["options"]["qos_vlarb_high"] == "1:255"
    for what, (tables, rows) in applied.items():
        assert tables == {"high": [(1, 255)], "low": [(0, 64), (2, 4)]}, (what, applied)
        assert rows and all(row == [0, 1, 2] + [0] * 13 for row in rows), (what, rows)
    # the guaranteed lease's P_Key maps to SL 1 in the policy and in OpenSM's path records
    assert f"any, pkey {pkeys[guaranteed.pk]:#06x} : 1" in policy
    assert f"any, pkey {pkeys[standard.pk]:#06x} : 0" in policy
    assert slids == {guaranteed.pk: 1, standard.pk: 0}
    assert "ERR AC" not in log  # OpenSM parsed the policy
    # the provider's new weights, exported by the agent, are what the ports hold
    assert changed.status_code == 200, changed.content
    for what, (tables, _rows) in reapplied.items():
        assert tables == {"high": [(1, 128)], "low": [(0, 32), (2, 8)]}, (what, reapplied)
    # opensm.conf: only the QoS lines changed, every other line as it was
    after = simulated_fabric.opensm_conf.read_text().splitlines()
    owned = set(qos.OPENSM_OPTIONS) | {"qos_policy_file"}
    assert [line for line in after if line.split(" ", 1)[0] not in owned] == \
        [line for line in conf_before.splitlines() if line.split(" ", 1)[0] not in owned]
    assert "qos TRUE" in after and "qos_vlarb_low 0:32,2:8" in after

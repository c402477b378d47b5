"""A partition per lease, for real: leases placed by IBEX on a fat tree simulated by ibsim, the
fabric agent writing OpenSM's partitions.conf and signalling it, and every HCA's P_Key table
read back with `smpquery pkeys` (what OpenSM programmed, not what IBEX meant to)."""

import re
import subprocess
import time

import pytest

from agent.fabric_agent import FabricAgent, FabricAgentOptions
from billing import services as money
from fabric import services as fabric_services
from fabric.models import Fabric
from ibex.accounts import services as accounts
from market import prices
from pool import services as pool
from pool.models import Node
from tests.fabric.live.conftest import SPEC_64
from tests.factories import client_for, make_org, report_every_gpu
from tests.scheduler.moves.test_remediation import active_lease

pytestmark = pytest.mark.django_db(transaction=True)

PROVIDER_LINES = ("# the provider's own partitions\n"
                  "Default=0x7fff, ipoib : ALL=full ;\n"
                  "storage=0x0002 : ALL=limited ;\n")
APPLIED_WITHIN_S = 15.0


@pytest.fixture
def fabric_spec():
    """64 hosts here (the other live tests that borrow these fixtures keep their 16)."""
    return SPEC_64


@pytest.fixture
def market(simulated_fabric, fabric_spec):
    provider = make_org("hpc-provider", "provider")
    accounts.change_provider_state(organization=provider, to_state="verified", actor="test",
                                   reason="audit")
    pool.ensure_gpu_catalogue()
    fabric_services.save_fabric(owner=provider, name="live-ft", spec=fabric_spec,
                                source="generator")
    pool.register_nodes(provider=provider, specs=[
        pool.NodeSpec(hostname=host, fabric="live-ft", gpu_model="H100-80GB", gpu_count=8,
                      cpu_cores=64, memory_gib=1024) for host in fabric_spec.hosts])
    report_every_gpu(provider)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "live-ft"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000_000_000, reason="t", actor="t")
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    return client_for(tenant), key


@pytest.fixture
def agent(live_server, simulated_fabric, market):
    (simulated_fabric.osm_dir / "partitions.conf").write_text(PROVIDER_LINES)
    return FabricAgent(FabricAgentOptions(
        server=live_server.url, token=market[1], fabric="live-ft", interval_s=1,
        opensm_conf_dir=simulated_fabric.osm_dir, opensm_pid_file=simulated_fabric.opensm_pid_file,
        command_timeout_s=5, env=simulated_fabric.env))


def pkey_tables(agent, simulated_fabric) -> dict[str, set[int]]:
    """Every HCA's P_Key table as OpenSM programmed it, by host: `smpquery pkeys LID`."""
    discovery = agent.reader.discovery
    hosts = {hca.guid: hca.host for hca in SPEC_64.hcas}
    tables = {}
    for guid, node in discovery.nodes.items():
        if node.kind != "ca":
            continue
        out = subprocess.run(["smpquery", "pkeys", str(node.lid)], env=simulated_fabric.env,
                             capture_output=True, text=True, timeout=10, check=True).stdout
        keys = {int(key, 16) for line in out.splitlines() if re.match(r"\s*\d+:", line)
                for key in re.findall(r"0x[0-9a-fA-F]{4}", line)}
        tables[hosts[guid]] = keys - {0x0000}
    return tables


def wait_for_tables(agent, simulated_fabric, expected) -> dict[str, set[int]]:
    """Until every HCA's table is `expected` (OpenSM applies a SIGHUP in about two seconds)."""
    deadline = time.monotonic() + APPLIED_WITHIN_S
    while True:
        tables = pkey_tables(agent, simulated_fabric)
        if tables == expected or time.monotonic() > deadline:
            return tables
        time.sleep(0.5)


def hosts_of(client, lease) -> set[str]:
    return {gpu["node"] for gpu in client.get(f"/api/v1/leases/{lease.pk}/").json()["gpus"]}


def test_two_leases_get_distinct_pkeys_on_exactly_their_hcas_and_an_ended_one_loses_its_own(
        agent, simulated_fabric, market):
    client, _key = market
    first, second = active_lease(client, gpus=16), active_lease(client, gpus=16)
    first_hosts, second_hosts = hosts_of(client, first), hosts_of(client, second)
    pkeys = [int(client.get(f"/api/v1/leases/{lease.pk}/").json()["fabric"]["pkey"], 16)
             for lease in (first, second)]
    base = {0xFFFF, 0x0002}  # the default partition (full) and the provider's (limited)

    agent.poll_once()
    applied = wait_for_tables(agent, simulated_fabric, {
        host: base | ({0x8000 | pkeys[0]} if host in first_hosts else set())
        | ({0x8000 | pkeys[1]} if host in second_hosts else set()) for host in SPEC_64.hosts})
    client.post(f"/api/v1/leases/{first.pk}/terminate/")
    agent.poll_once()
    ended = wait_for_tables(agent, simulated_fabric, {
        host: base | ({0x8000 | pkeys[1]} if host in second_hosts else set())
        for host in SPEC_64.hosts})

    assert pkeys[0] != pkeys[1] and len(first_hosts) == len(second_hosts) == 2
    assert not first_hosts & second_hosts
    for host in SPEC_64.hosts:
        assert (0x8000 | pkeys[0] in applied[host]) == (host in first_hosts), (host, applied)
        assert (0x8000 | pkeys[1] in applied[host]) == (host in second_hosts), (host, applied)
        assert 0x8000 | pkeys[0] not in ended[host], (host, ended)
        assert (0x8000 | pkeys[1] in ended[host]) == (host in second_hosts), (host, ended)
        assert base <= ended[host]
    text = (simulated_fabric.osm_dir / "partitions.conf").read_text()
    assert text.startswith(PROVIDER_LINES)
    assert f"ibex_{pkeys[0]:04x}" not in text and f"ibex_{pkeys[1]:04x}" in text


def test_an_unchanged_poll_leaves_the_file_alone_and_does_not_signal_opensm(
        agent, simulated_fabric, market):
    client, _key = market
    active_lease(client, gpus=16)
    agent.poll_once()
    written = agent.partitions_written
    stat = (simulated_fabric.osm_dir / "partitions.conf").stat()

    agent.poll_once()

    assert written.changed and written.signalled and written.partitions == 1
    assert not agent.partitions_written.changed and not agent.partitions_written.signalled
    assert (simulated_fabric.osm_dir / "partitions.conf").stat().st_mtime_ns == stat.st_mtime_ns
    # the report carried the P_Keys of the provider's own lines: no lease will get them
    assert Fabric.objects.get().provider_pkeys == [0x0002, 0x7FFF]

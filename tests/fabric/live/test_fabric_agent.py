"""`ibex-agent fabric` against a real simulated fabric (ibsim + OpenSM), reporting over HTTP to
the real API: IBEX's links follow the cables ibsim unlinks and relinks, its counters follow
`PerformanceSet`, and a simulator that stops is an unreachable fabric, not a fabric of dead
cables. Each test polls by calling the agent's `poll_once` (no sleeping on intervals)."""

from pathlib import Path

import pytest

from agent.fabric_agent import FabricAgent, FabricAgentOptions
from fabric import services
from fabric.models import Fabric, Link, LinkStateChange, PortCounters
from ibex.accounts import services as accounts
from tests.fabric.live.conftest import SPEC
from tests.factories import make_org

pytestmark = pytest.mark.django_db(transaction=True)

SWITCH_NAMES = {switch.guid: switch.name for switch in SPEC.switches}
LEAF01 = next(guid for guid, name in SWITCH_NAMES.items() if name == "leaf01")
SPINE01 = next(guid for guid, name in SWITCH_NAMES.items() if name == "spine01")
UPLINK = next(link for link in SPEC.links if link.a_guid == LEAF01 and link.b_guid == SPINE01)
HOST_CABLE = next(link for link in SPEC.links if link.b_guid == LEAF01)  # node01 - leaf01


@pytest.fixture
def provider_fabric(db):
    provider = make_org("hpc-provider", "provider")
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    services.save_fabric(owner=provider, name="live-ft", spec=SPEC, source="generator")
    return key


@pytest.fixture
def agent(live_server, simulated_fabric, provider_fabric):
    return FabricAgent(FabricAgentOptions(
        server=live_server.url, token=provider_fabric, fabric="live-ft", interval_s=1,
        opensm_conf_dir=simulated_fabric.osm_dir, opensm_pid_file=simulated_fabric.opensm_pid_file,
        command_timeout_s=5, env=simulated_fabric.env))


def link_state(link) -> str:
    return Link.objects.get(ends__device_guid=link.a_guid, ends__number=link.a_port).state


def test_the_first_poll_matches_every_cable_of_the_fabric(agent):
    answer = agent.poll_once()

    assert answer["reachable"] is True
    assert answer["links"]["active"] == len(SPEC.links) and answer["links"]["down"] == 0
    assert answer["unmatched_links"] == 0
    assert answer["counters"] == {"stored": 2 * len(SPEC.links), "unmatched": 0}
    fabric = Fabric.objects.get()
    assert fabric.agent_reachable is True
    assert fabric.live_summary["subnet_manager"]["running"] is True
    assert set(Link.objects.values_list("rate_gbps", flat=True)) == {100}


def test_an_unlinked_uplink_is_down_after_the_next_poll_and_active_after_relink(
        agent, simulated_fabric):
    agent.poll_once()

    simulated_fabric.console(f'Unlink "leaf01"[{UPLINK.a_port}]')
    down = agent.poll_once()
    simulated_fabric.console(f'ReLink "leaf01"[{UPLINK.a_port}]')
    simulated_fabric.wait_until_every_cable_is_active()  # OpenSM's next sweep
    up = agent.poll_once()

    assert down["links"]["down"] == 1
    assert down["changed"][0]["name"] == f"leaf01 port {UPLINK.a_port} - spine01 port {UPLINK.b_port}"
    assert up["links"]["down"] == 0
    assert list(LinkStateChange.objects.order_by("at").values_list("to_state", flat=True)) == [
        "down", "active"]
    assert link_state(UPLINK) == "active"


def test_a_relinked_cable_is_init_until_the_subnet_manager_activates_it(
        agent, simulated_fabric):
    agent.poll_once()
    simulated_fabric.stop_opensm()

    simulated_fabric.console(f'Unlink "leaf01"[{UPLINK.a_port}]')
    simulated_fabric.console(f'ReLink "leaf01"[{UPLINK.a_port}]')
    answer = agent.poll_once()

    assert answer["links"]["init"] == 1 and answer["links"]["down"] == 0
    assert link_state(UPLINK) == "init"
    assert [(change["from"], change["to"]) for change in answer["changed"]] == [("active", "init")]


def test_a_host_whose_only_cable_is_unlinked_has_that_cable_down(agent, simulated_fabric):
    agent.poll_once()

    simulated_fabric.console(f'Unlink "leaf01"[{HOST_CABLE.b_port}]')
    answer = agent.poll_once()

    assert answer["links"]["down"] == 1
    assert link_state(HOST_CABLE) == "down"


def test_a_stopped_simulator_is_reported_unreachable_and_ibex_keeps_its_last_view(
        agent, simulated_fabric):
    agent.poll_once()
    simulated_fabric.console(f'Unlink "leaf01"[{UPLINK.a_port}]')
    agent.poll_once()

    simulated_fabric.stop()
    answer = agent.poll_once()

    assert answer["reachable"] is False
    fabric = Fabric.objects.get()
    assert fabric.agent_reachable is False
    assert "ibnetdiscover" in fabric.agent_error
    assert fabric.live_summary["subnet_manager"]["running"] is False
    assert Link.objects.filter(state="down").count() == 1
    assert Link.objects.filter(state="active").count() == len(SPEC.links) - 1


@pytest.mark.parametrize("tool", ["perfquery", "ibqueryerrors"])
def test_counters_set_in_the_simulator_are_stored_with_the_sample_before(
        agent, simulated_fabric, tool):
    agent.reader.counters_tool = tool
    agent.poll_once()

    simulated_fabric.console(f'PerformanceSet "leaf01"[{UPLINK.a_port}] '
                             f"PortCounters.SymbolErrorCounter=7")
    simulated_fabric.console(f'PerformanceSet "leaf01"[{UPLINK.a_port}] '
                             f"PortCounters.LinkDownedCounter=2")
    simulated_fabric.console(f'PerformanceSet "leaf01"[{UPLINK.a_port}] '
                             f"PortCountersExtended.PortXmitData=123456789012")
    agent.poll_once()

    row = PortCounters.objects.get(port__device_guid=LEAF01, port__number=UPLINK.a_port)
    assert (row.symbol_errors, row.link_downed) == (7, 2)
    # the simulator counts the management packets that crossed the port since the set
    assert 123456789012 <= row.xmit_data < 123456789012 + 1_000_000
    assert row.extended is True
    assert row.previous_symbol_errors == 0 and row.previous_sampled_at < row.sampled_at
    assert PortCounters.objects.count() == 2 * len(SPEC.links)


def test_a_poll_of_an_unchanged_fabric_sends_no_topology(agent, simulated_fabric, monkeypatch):
    agent.poll_once()
    sent = []
    original = agent.client.fabric_report
    monkeypatch.setattr(agent.client, "fabric_report",
                        lambda *args: sent.append(args[2]) or original(*args))

    agent.poll_once()

    assert len(sent) == 1 and "links" not in sent[0] and sent[0]["counters"]


def test_the_command_line_polls_once(live_server, simulated_fabric, provider_fabric, capsys,
                                     monkeypatch):
    from agent.cli import main

    for name, value in simulated_fabric.env.items():
        monkeypatch.setenv(name, value)

    code = main(["fabric", "--server", live_server.url, "--token", provider_fabric,
                 "--fabric", "live-ft", "--interval", "5", "--opensm-conf-dir",
                 str(simulated_fabric.osm_dir), "--opensm-pid-file",
                 str(Path(simulated_fabric.opensm_pid_file)), "--once"])

    assert code == 0
    assert f"links {len(SPEC.links)} active, 0 down" in capsys.readouterr().out

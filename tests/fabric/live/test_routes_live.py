"""Routes for real: the fabric agent reads every switch's forwarding table (`dump_fts`) from
OpenSM's ftree routing under ibsim, IBEX stores them and traces the directed links between two
hosts; when an uplink on a route is unlinked, OpenSM routes around it and IBEX's routes follow
after the agent's next poll."""

import subprocess
import time

import pytest

from agent.fabric_agent import FabricAgent, FabricAgentOptions
from fabric import services
from fabric.models import Fabric, FabricRoutes, Link
from fabric.selectors import lease_links, route_map
from ibex.accounts import services as accounts
from tests.fabric.live.conftest import SPEC
from tests.factories import make_org

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def agent(live_server, simulated_fabric):
    provider = make_org("hpc-provider", "provider")
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    services.save_fabric(owner=provider, name="live-ft", spec=SPEC, source="generator")
    return FabricAgent(FabricAgentOptions(
        server=live_server.url, token=key, fabric="live-ft", interval_s=1,
        command_timeout_s=5, env=simulated_fabric.env))


def test_the_first_poll_sends_the_routes_and_the_next_does_not_send_them_again(agent):
    first = agent.poll_once()
    second = agent.poll_once()

    assert first["routes_changed"] is True and first["routes_hash"].startswith("sha256:")
    assert second["routes_changed"] is False and second["routes_hash"] == first["routes_hash"]
    held = FabricRoutes.objects.get()
    assert len(held.tables) == 8  # 4 leaves and 4 spines, one table each
    assert len(held.lids) == 8 + 16


def test_the_route_between_hosts_on_two_leaves_crosses_the_spine_their_tables_give(
        agent, simulated_fabric):
    agent.poll_once()
    route = route_map(Fabric.objects.get())

    hops = route.path("node01", "node16")

    names = [route.name(hop) for hop in hops]
    assert names[0] == "node01 port 1 → leaf01" and names[-1].endswith("→ node16")
    assert len(hops) == 4 and names[1].startswith("leaf01 port ") and "→ spine" in names[1]
    # leaf01's own table, read with ibroute, sends node16's LID out of that port
    lid = route.lids[route.host_ports["node16"][0]]
    leaf01_lid = route.lids[hops[1][0]]
    table = subprocess.run(["ibroute", str(leaf01_lid)], env=simulated_fabric.env,
                           capture_output=True, text=True, timeout=10).stdout
    assert f"0x{lid:04x} {hops[1][1]:03d}" in table


def test_after_an_uplink_on_a_route_is_unlinked_the_routes_go_around_it(agent, simulated_fabric):
    agent.poll_once()
    fabric = Fabric.objects.get()
    uplink = route_map(fabric).path("node01", "node16")[1]  # leaf01 port N → a spine
    ring = {(item["guid"], item["port"]) for item in lease_links(fabric, ["node01", "node16"])}
    assert uplink in ring

    simulated_fabric.console(f'Unlink "leaf01"[{uplink[1]}]')
    deadline = time.monotonic() + 20
    while True:  # OpenSM sweeps every second: its new tables are read by a poll after it
        answer = agent.poll_once()
        if answer["routes_changed"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)

    assert answer["routes_changed"] is True
    route = route_map(fabric)
    assert uplink in route.down
    assert Link.objects.get(ends__device_guid=uplink[0], ends__number=uplink[1]).state == "down"
    new_path = route.path("node01", "node16")
    assert uplink not in new_path and len(new_path) == 4

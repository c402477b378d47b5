"""`manage.py fabric_sim FABRIC`: a fabric of the database simulated by a real ibsim under a real
OpenSM, read by the real fabric agent reporting to the real API over loopback. Its links follow
the console commands typed on its standard input or written to its console FIFO, and a SIGTERM
stops the agent, OpenSM and ibsim, leaving no process behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from agent.fabric_agent import FabricReader
from fabric import services
from fabric.core import generators
from fabric.core.netfile import ibsim_netfile
from fabric.live_sim import ROUTING_ENGINES, SimulatedFabric
from fabric.models import Fabric, Link
from fabric.selectors import load_spec
from ibex.accounts import services as accounts
from tests.conftest import child_env
from tests.fabric.live.conftest import SPEC
from tests.factories import make_org

INTERVAL_S = 1
WITHIN_S = 30  # a few intervals, on a machine whose cores are shared

UPLINK = next(link for link in SPEC.links
              if {s.name for s in SPEC.switches if s.guid in (link.a_guid, link.b_guid)}
              == {"leaf01", "spine01"})
LEAF01_PORT = UPLINK.a_port if SPEC.switch_by_guid()[UPLINK.a_guid].name == "leaf01" \
    else UPLINK.b_port


def wait_until(condition, what: str, process: subprocess.Popen | None = None):
    deadline = time.monotonic() + WITHIN_S
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"fabric_sim exited ({process.returncode}) while waiting for {what}:\n"
                        f"{process.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def uplink_state() -> str:
    return Link.objects.get(ends__device_guid=UPLINK.a_guid, ends__number=UPLINK.a_port).state


@pytest.mark.django_db(transaction=True)
def test_the_command_brings_the_fabric_live_follows_the_console_and_stops_every_process(
        live_server, tmp_path):
    provider = make_org("hpc-provider", "provider")
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    services.save_fabric(owner=provider, name="live-ft", spec=SPEC, source="generator")
    Link.objects.update(state="down")  # so that `active` can only come from the live fabric
    directory = tmp_path / "sim"

    process = subprocess.Popen(
        [sys.executable, "manage.py", "fabric_sim", "live-ft", "--server", live_server.url,
         "--interval", str(INTERVAL_S), "--dir", str(directory)],
        cwd=settings.BASE_DIR, env=child_env(IBEX_API_KEY=key), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: Fabric.objects.filter(agent_reachable=True).exists()
                   and not Link.objects.exclude(state="active").exists(),
                   "every link active and the agent reachable", process)

        # a console command written to the FIFO, then one typed on standard input
        (directory / "console").write_text(f'Unlink "leaf01"[{LEAF01_PORT}]\n')
        wait_until(lambda: uplink_state() == "down", "the unlinked cable down", process)
        process.stdin.write(f'ReLink "leaf01"[{LEAF01_PORT}]\n')
        process.stdin.flush()
        wait_until(lambda: uplink_state() == "active", "the relinked cable active", process)
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)

    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)", output)]
    assert process.returncode == 0, output
    assert len(pids) == 3, output  # ibsim, OpenSM, the agent
    assert [pid for pid in pids if alive(pid)] == []
    assert "stopped the fabric agent, OpenSM and ibsim" in output
    assert key not in output
    assert (directory / "opensm" / "partitions.conf").exists()  # the agent wrote OpenSM's file
    fabric = Fabric.objects.get()
    assert fabric.live_summary["subnet_manager"]["running"] is True
    assert fabric.link_changes.count() == len(SPEC.links) + 2  # down -> active, then the uplink


@pytest.mark.parametrize("kind", ["fat-tree", "rail-optimised", "torus", "dragonfly"])
def test_each_generated_kind_comes_up_under_opensm_and_reads_back_every_cable(
        provider, tmp_path, kind):
    spec = {"fat-tree": generators.fat_tree(64, 8, tiers=3, rate_gbps=100),
            "rail-optimised": generators.fat_tree(16, 8, rails=2, rate_gbps=100),
            "torus": generators.torus(4, 4, 4, rate_gbps=100),
            "dragonfly": generators.dragonfly(2, 2, 2, rate_gbps=100)}[kind]
    services.save_fabric(owner=provider, name="f", spec=spec, source="generator")
    sim = SimulatedFabric(tmp_path, ibsim_netfile(load_spec(Fabric.objects.get(name="f"))),
                          routing_engine=ROUTING_ENGINES[kind])
    try:
        sim.start()  # waits for SUBNET UP
        sim.wait_until_every_cable_is_active()
        _, topology = FabricReader(env=sim.env, counters_tool="ibqueryerrors").read()
    finally:
        sim.stop()

    assert len(topology["links"]) == len(spec.links)
    assert {link["state"] for link in topology["links"]} == {"active"}
    assert {node["guid"] for node in topology["nodes"]} == \
        {s.guid for s in spec.switches} | {h.guid for h in spec.hcas}


def test_a_missing_program_is_named_with_the_apt_get_line(db, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # ibsim lives in /usr/bin

    with pytest.raises(CommandError) as refused:
        call_command("fabric_sim", "any")

    assert str(refused.value).startswith("the live fabric needs ibsim")
    assert "apt-get install ibsim-utils" in str(refused.value)


def test_with_if_installed_a_missing_program_turns_the_live_fabric_off_in_one_line(
        db, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))

    call_command("fabric_sim", "any", "--if-installed")

    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "the live fabric is off" in out[0] and "apt-get install" in out[0]


def test_an_unknown_fabric_is_refused_listing_those_that_exist(provider):
    services.save_fabric(owner=provider, name="ft", spec=SPEC, source="generator")

    with pytest.raises(CommandError, match="no fabric named 'nope'; the fabrics are: ft"):
        call_command("fabric_sim", "nope", "--token", "k")

    assert not Fabric.objects.filter(agent_seen_at__isnull=False).exists()


def test_a_fabric_beyond_ibsim_is_refused_with_the_numbers(provider, tmp_path):
    services.save_fabric(owner=provider, name="big", spec=generators.torus(7, 7, 6),
                         source="generator")

    with pytest.raises(CommandError) as refused:
        call_command("fabric_sim", "big", "--token", "k", "--dir", str(tmp_path))

    assert str(refused.value) == ("big has 588 nodes (294 switches): ibsim holds at most 2048 "
                                  "nodes and 256 switches")
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing started


def test_without_a_key_the_command_says_whose_key_it_needs(provider, monkeypatch):
    monkeypatch.delenv("IBEX_API_KEY", raising=False)
    services.save_fabric(owner=provider, name="ft", spec=SPEC, source="generator")

    with pytest.raises(CommandError, match=f"a key of the fabric's provider \\({provider.slug}\\)"):
        call_command("fabric_sim", "ft")


def test_the_demo_runs_its_live_fabric_with_the_key_in_the_environment(db, settings, tmp_path,
                                                                       monkeypatch):
    from ibex.run import live_fabric

    monkeypatch.setenv("IBEX_VAR_DIR", str(tmp_path))
    settings.DEBUG = True
    call_command("seed_demo", verbosity=0)

    argv, key = live_fabric("127.0.0.1", 8000)

    assert argv[2:5] == ["fabric_sim", "hpc-one-h100", "--if-installed"]
    assert key not in " ".join(argv)
    assert key == json.loads((tmp_path / "demo" / "credentials.json").read_text())["hpc-one"]["key"]
    ibsim_netfile(load_spec(Fabric.objects.get(name="hpc-one-h100")))  # within ibsim's limits
    assert os.path.basename(argv[-1]) == "fabric-sim"


@pytest.mark.django_db(transaction=True)
def test_a_command_killed_outright_takes_ibsim_opensm_and_the_agent_with_it(provider, tmp_path):
    services.save_fabric(owner=provider, name="ft", spec=SPEC, source="generator")
    directory = tmp_path / "sim"
    # no server: the agent polls the fabric once, cannot report, and sleeps out its interval
    process = subprocess.Popen(
        [sys.executable, "manage.py", "fabric_sim", "ft", "--server", "http://127.0.0.1:9",
         "--interval", "600", "--dir", str(directory)],
        cwd=settings.BASE_DIR, env=child_env(IBEX_API_KEY="unused"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    agent_log = directory / "agent.log"
    wait_until(lambda: agent_log.exists() and "cannot reach" in agent_log.read_text(),
               "the agent's first poll", process)

    process.kill()
    output, _ = process.communicate(timeout=30)
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)", output)]
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)

    assert len(pids) == 3, output
    assert [pid for pid in pids if alive(pid)] == []


def test_a_directory_that_cannot_be_written_is_refused_and_starts_nothing(provider, tmp_path):
    services.save_fabric(owner=provider, name="ft", spec=SPEC, source="generator")
    (tmp_path / "a-file").write_text("")

    with pytest.raises(CommandError, match="cannot write the simulator's files in"):
        call_command("fabric_sim", "ft", "--token", "k", "--dir", str(tmp_path / "a-file"))

    assert (tmp_path / "a-file").read_text() == ""

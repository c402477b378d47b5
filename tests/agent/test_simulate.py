"""`ibex-agent simulate` against a real local HTTP server."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.cli import hostnames_of, main
from agent.fleet import Fleet, FleetOptions
from tests.agent.fake_ibex import PROVIDER_KEY, FakeIbex
from tests.clock import python_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        server.heartbeat_interval_s = 0.05
        yield server


def fleet_for(ibex, hosts: str, **options) -> Fleet:
    return Fleet(FleetOptions(
        api=ibex.url, key=PROVIDER_KEY, fabric="fab1", hostnames=hostnames_of(hosts),
        gpu_model="H100-80GB", gpus=8, interval_s=0.05, workers=4, **options,
    ))


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


@contextmanager
def running(fleet: Fleet):
    """The fleet runs in a thread for the duration of the with block."""
    thread = threading.Thread(target=fleet.run)
    thread.start()
    try:
        yield fleet
    finally:
        fleet.stop.set()
        thread.join(5)
    assert not thread.is_alive()


def run_until(fleet: Fleet, done) -> None:
    with running(fleet):
        wait_for(done)


def test_simulate_registers_hosts_in_bulk_chunks_and_heartbeats_each(ibex):
    fleet = fleet_for(ibex, "gpu[01-07]", bulk_size=3)

    run_until(fleet, lambda: all(len(n.heartbeats) >= 2 for n in ibex.nodes.values()) and len(ibex.nodes) == 7)

    bulk = [r for r in ibex.requests if r.path == "/api/v1/nodes/bulk/"]
    assert [len(r.body["nodes"]) for r in bulk] == [3, 3, 1]
    spec = bulk[0].body["nodes"][0]
    assert spec["hostname"] == "gpu01" and spec["gpu_model"] == "H100-80GB" and spec["gpu_count"] == 8
    assert [gpu["index"] for gpu in spec["gpus"]] == list(range(8))
    assert sorted(n.hostname for n in ibex.nodes.values()) == [f"gpu0{i}" for i in range(1, 8)]
    beat = ibex.node_named("gpu03").heartbeats[0]
    assert len(beat["gpus"]) == 8 and len(beat["ib_ports"]) == 8 and beat["serving"] == []
    for gpu in beat["gpus"]:
        assert 30 <= gpu["temperature_c"] <= 40 and gpu["utilization_pct"] == 0
        assert gpu["ecc_errors"] == 0 and gpu["xid_errors"] == 0


def test_simulate_rotates_tokens_of_hosts_that_already_exist(ibex):
    ibex.add_node("gpu02", state="retired")  # an old node of the same name is left alone
    ibex.add_node("gpu04", fabric="other-fabric")  # and so is a namesake in another fabric
    existing = ibex.add_node("gpu02"), ibex.add_node("gpu04")
    old_tokens = [node.token for node in existing]
    fleet = fleet_for(ibex, "gpu[01-05]")

    run_until(fleet, lambda: len(ibex.nodes) == 7
              and all(ibex.node_named(f"gpu0{i}").heartbeats for i in (1, 3, 5))
              and all(node.heartbeats for node in existing))

    assert [node.token for node in existing] != old_tokens
    assert [fleet.hosts[1].node_id, fleet.hosts[3].node_id] == [node.id for node in existing]
    assert all(node.heartbeats for node in existing)
    bulk = [r for r in ibex.requests if r.path == "/api/v1/nodes/bulk/"]
    assert [[s["hostname"] for s in r.body["nodes"]] for r in bulk] == [
        ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"], ["gpu01", "gpu03", "gpu05"],
    ]


def test_hosts_named_by_a_bulk_409_are_looked_up_one_by_one(ibex, monkeypatch):
    ibex.bulk_conflict_fields = True
    existing = ibex.add_node("gpu02")
    listing = ibex._list
    # a listing that misses the node (say, a race): the 409's field keys must do
    monkeypatch.setattr(ibex, "_list", lambda query: listing(query) if "hostname" in query
                        else {"results": [], "next": None, "previous": None})
    fleet = fleet_for(ibex, "gpu[01-03]")

    run_until(fleet, lambda: len(ibex.nodes) == 3 and all(n.heartbeats for n in ibex.nodes.values()))

    assert ibex.requests[2].query == {"hostname": ["gpu02"]}
    assert fleet.hosts[1].node_id == existing.id


def test_simulated_nodes_obey_actions_and_look_busy(ibex):
    with running(fleet_for(ibex, "gpu01")):
        wait_for(lambda: bool(ibex.nodes) and bool(ibex.node_named("gpu01").heartbeats))
        node = ibex.node_named("gpu01")
        ibex.queue_action(node.id, "start", "L-1", [0, 1])
        wait_for(lambda: any(b["serving"] == ["L-1"] for b in node.heartbeats))

    busy = next(b for b in node.heartbeats if b["serving"] == ["L-1"])
    for gpu in busy["gpus"][:2]:
        assert 60 <= gpu["temperature_c"] <= 75 and gpu["utilization_pct"] >= 90
        assert gpu["memory_used_mib"] > 40000
    assert busy["gpus"][2]["utilization_pct"] == 0


def test_control_file_fails_a_gpu_and_stops_a_node(ibex, tmp_path):
    control = tmp_path / "control.json"
    control.write_text(json.dumps({
        "fail_gpus": {"gpu01": [2]}, "degrade_gpus": {"gpu02": [1]}, "stop_heartbeats": ["gpu03"],
    }))
    with running(fleet_for(ibex, "gpu[01-03]", control_path=control)):
        wait_for(lambda: len(ibex.nodes) == 3
                 and all(len(ibex.node_named(h).heartbeats) >= 3 for h in ("gpu01", "gpu02")))

        assert ibex.node_named("gpu03").heartbeats == []
        failed = ibex.node_named("gpu01").heartbeats[-1]["gpus"][2]
        assert failed["ecc_errors"] >= 1 and failed["xid_errors"] == 79
        degraded = [beat["gpus"][1] for beat in ibex.node_named("gpu02").heartbeats]
        assert [gpu["xid_errors"] for gpu in degraded[:3]] == [1, 2, 3]
        assert all(gpu["temperature_c"] >= 90 for gpu in degraded)

        # taking the host out of the file brings its heartbeats back
        control.write_text(json.dumps({"stop_heartbeats": []}))
        os.utime(control, (time.time() + 5, time.time() + 5))  # a new mtime even on coarse clocks
        wait_for(lambda: bool(ibex.node_named("gpu03").heartbeats))


def test_a_refused_node_stops_alone(ibex):
    fleet = fleet_for(ibex, "gpu[01-02]")
    with running(fleet):
        wait_for(lambda: len(ibex.nodes) == 2 and all(n.heartbeats for n in ibex.nodes.values()))
        ibex.node_named("gpu01").token = "revoked"
        before = len(ibex.node_named("gpu02").heartbeats)
        wait_for(lambda: len(ibex.node_named("gpu02").heartbeats) >= before + 3)

    assert fleet.hosts[0].stopped and not fleet.hosts[1].stopped


def test_simulated_readings_repeat_with_the_same_seed(ibex):
    first = fleet_for(ibex, "gpu01", seed=7).hosts[0]
    second = fleet_for(ibex, "gpu01", seed=7).hosts[0]
    other = fleet_for(ibex, "gpu01", seed=8).hosts[0]
    from agent.simulated import Control

    assert first.sample(Control()) == second.sample(Control())
    assert [first.sample(Control()) for _ in range(3)] != [other.sample(Control()) for _ in range(3)]


def test_simulate_cli_runs_for_a_duration(ibex, capsys):
    code = main(["simulate", "--api", ibex.url, "--key", PROVIDER_KEY, "--fabric", "fab1",
                 "--hosts", "a[1-2]-b[01-02]", "--gpu-model", "H100-80GB", "--gpus", "4",
                 "--interval", "0.05", "--duration", "0.4", "--workers", "2"])

    assert code == 0
    assert sorted(n.hostname for n in ibex.nodes.values()) == ["a1-b01", "a1-b02", "a2-b01", "a2-b02"]
    assert all(node.heartbeats for node in ibex.nodes.values())
    assert "simulate: stopped after" in capsys.readouterr().err


def test_simulate_cli_with_a_bad_key_is_one_line(ibex, capsys):
    code = main(["simulate", "--api", ibex.url, "--key", "wrong", "--fabric", "fab1",
                 "--hosts", "gpu[01-02]", "--gpu-model", "H100-80GB", "--duration", "1"])

    assert code == 1
    assert capsys.readouterr().err == "ibex-agent: the server refused the key (401)\n"


def test_simulate_cli_rejects_a_bad_host_list(capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["simulate", "--api", "http://127.0.0.1:1", "--key", "k", "--fabric", "f",
              "--hosts", "gpu[01-", "--gpu-model", "H100-80GB"])
    assert stopped.value.code == 2
    assert "--hosts: unclosed '['" in capsys.readouterr().err


def test_simulate_reloads_the_control_file_on_sigusr1_and_stops_on_sigterm(ibex, tmp_path):
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"fail_gpus": {"gpu02": [1]}}))
    first_seen = control.stat()
    process = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--api", ibex.url, "--key", PROVIDER_KEY,
         "--fabric", "fab1", "--hosts", "gpu[01-02]", "--gpu-model", "H100-80GB",
         "--interval", "0.05", "--control", str(control)],
        cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": python_path(str(REPO))},
    )

    wait_for(lambda: len(ibex.nodes) == 2 and all(n.heartbeats for n in ibex.nodes.values()))
    # same size and mtime: only the signal can make the agent notice the change
    control.write_text(json.dumps({"fail_gpus": {"gpu02": [0]}}))
    os.utime(control, ns=(first_seen.st_atime_ns, first_seen.st_mtime_ns))
    time.sleep(0.2)
    assert ibex.node_named("gpu02").heartbeats[-1]["gpus"][0]["xid_errors"] == 0
    process.send_signal(signal.SIGUSR1)
    wait_for(lambda: ibex.node_named("gpu02").heartbeats[-1]["gpus"][0]["xid_errors"] == 79)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=10)

    assert process.returncode == 0, err
    assert ibex.node_named("gpu02").heartbeats[-1]["gpus"][0]["xid_errors"] == 79
    assert "failed GPUs gpu02:[0]" in err
    assert "Traceback" not in err


def simulated_launch(**fields) -> dict:
    return {"generation": 1, "command": ["python3", "train.py"], "env": {}, "workdir": "",
            "ssh_keys": [], "node_rank": 0, "nnodes": 2, "node_addrs": ["gpu01", "gpu02"],
            "master_addr": "gpu01", "master_port": None, **fields}


def test_simulated_hosts_pretend_to_run_workloads_and_ship_their_logs(ibex):
    with running(fleet_for(ibex, "gpu[01-02]")):
        wait_for(lambda: len(ibex.nodes) == 2 and all(n.heartbeats for n in ibex.nodes.values()))
        first, second = ibex.node_named("gpu01"), ibex.node_named("gpu02")
        assert first.heartbeats[-1]["runtime"] == {"kind": "process", "address": "gpu01", "ssh_port": None}
        assert "wait_s" not in first.heartbeats[-1]  # thousands of hosts: never held
        ibex.queue_action(first.id, "start", "77", [0, 1], launch=simulated_launch(
            env={"IBEX_SIMULATED_SECONDS": "0.3"}))
        ibex.queue_action(second.id, "start", "77", [3], launch=simulated_launch(node_rank=1, master_port=29500))

        running_entry = wait_for_entry(first, "77", "running")
        assert running_entry["master_port"] == 29500 and running_entry["generation"] == 1
        assert wait_for_entry(second, "77", "running")["master_port"] is None
        exited = wait_for_entry(first, "77", "exited")
        assert exited["exit_code"] == 0 and exited["ended_at"].endswith("Z")

        # a deadline far off: the simulated rank stops at the notice, not at its deadline
        until = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        ibex.queue_action(second.id, "notice", "77", [3], until=until)
        assert wait_for_entry(second, "77", "stopped")["exit_code"] == 143
        ibex.queue_action(second.id, "stop", "77", [3], grace_s=0)
        wait_for(lambda: second.heartbeats[-1]["serving"] == [] and second.workload("77") is None)

    lines = first.log_lines("77")
    assert lines[0] == "simulated: rank 0 of 2 on gpu01, CUDA_VISIBLE_DEVICES=0,1"
    assert lines[1] == "simulated: command: python3 train.py"
    assert "NCCL_IB_HCA" in lines[2] and "MASTER_PORT" in lines[2]
    assert lines[-1] == "simulated: done, exit code 0"
    assert second.log_lines("77")[0] == "simulated: rank 1 of 2 on gpu02, CUDA_VISIBLE_DEVICES=3"
    assert second.log_lines("77")[-1] == "simulated: SIGTERM received; stopped"


def test_simulate_with_runtime_none_reports_no_workloads(ibex):
    with running(fleet_for(ibex, "gpu01", runtime="none")):
        wait_for(lambda: bool(ibex.nodes) and bool(ibex.node_named("gpu01").heartbeats))
        node = ibex.node_named("gpu01")
        ibex.queue_action(node.id, "start", "78", [0], launch=simulated_launch())
        wait_for(lambda: node.heartbeats[-1]["serving"] == ["78"])

    assert node.heartbeats[-1]["runtime"]["kind"] == "none" and "workloads" not in node.heartbeats[-1]
    assert node.logs == {}


def wait_for_entry(node, lease: str, state: str) -> dict:
    wait_for(lambda: (node.workload(lease) or {}).get("state") == state)
    return node.workload(lease)

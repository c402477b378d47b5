"""`ibex-agent run` against a real local HTTP server."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agent.cli import main
from agent.client import ApiClient, ApiError
from agent.heartbeat import GpuSample, retry_delay
from agent.node import NodeAgent
from agent.state import NodeState, load_state, save_state
from tests.agent.fake_ibex import FakeIbex
from tests.agent.runtime_helpers import make_work_dir
from tests.clock import python_path

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        yield server


@pytest.fixture
def registered(ibex, tmp_path):
    """A node the fake server knows, and a state file for it."""
    node = ibex.add_node("gpu01")
    path = tmp_path / "node.json"
    save_state(path, NodeState(api=ibex.url, node_id=node.id, token=node.token, hostname="gpu01"))
    return node, path


def error_lines(err: str) -> list[str]:
    """stderr without the timestamped log lines (here: the no-NVML warning)."""
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("ibex-agent: ")]


def run_once(path) -> int:
    return main(["run", "--once", "--quiet", "--state", str(path)])


def test_run_once_posts_a_well_formed_heartbeat(ibex, registered, capsys):
    node, path = registered

    assert run_once(path) == 0

    sent = ibex.requests[-1]
    assert sent.path == f"/api/v1/nodes/{node.id}/heartbeat/"
    assert sent.headers["Authorization"] == f"Node {node.token}"
    assert set(sent.body) == {"gpus", "ib_ports", "serving", "runtime", "workloads"}  # no wait_s: --once
    assert sent.body["serving"] == []
    assert sent.body["runtime"] == {"kind": "none", "address": socket.gethostname(), "ssh_port": None}
    assert sent.body["workloads"] == []
    assert isinstance(sent.body["gpus"], list) and isinstance(sent.body["ib_ports"], list)
    assert "no GPU readings" in capsys.readouterr().err  # no NVML here: said once, clearly


def test_run_obeys_start_and_stop_actions_in_the_next_heartbeats(ibex, registered):
    node, path = registered
    ibex.queue_action(node.id, "start", "L-123", [0, 1])
    ibex.queue_action(node.id, "start", "L-7", [2])

    assert run_once(path) == 0
    assert node.heartbeats[-1]["serving"] == []
    assert load_state(path).serving == {"L-123": [0, 1], "L-7": [2]}

    ibex.queue_action(node.id, "stop", "L-7", [2])
    assert run_once(path) == 0
    assert node.heartbeats[-1]["serving"] == ["L-123", "L-7"]

    assert run_once(path) == 0
    assert node.heartbeats[-1]["serving"] == ["L-123"]


def test_a_refused_token_exits_1_with_one_line(ibex, registered, capsys):
    node, path = registered
    node.token = "revoked"

    assert main(["run", "--quiet", "--interval", "0.05", "--state", str(path)]) == 1

    assert error_lines(capsys.readouterr().err) == ["ibex-agent: the server refused the node token (401)"]


def test_connection_refused_once_is_one_line(tmp_path, capsys):
    path = tmp_path / "node.json"
    save_state(path, NodeState(api="http://127.0.0.1:1", node_id=3, token="t", hostname="gpu01"))

    assert run_once(path) == 1

    assert error_lines(capsys.readouterr().err) == ["ibex-agent: cannot reach http://127.0.0.1:1: connection refused"]


def test_a_missing_state_file_is_one_line(tmp_path, capsys):
    assert run_once(tmp_path / "none.json") == 1
    assert "run 'ibex-agent register' first" in capsys.readouterr().err


def fake_gpus() -> list[GpuSample]:
    return [GpuSample(0, 45, 80, 1000, 0, 0)]


def test_the_loop_backs_off_on_server_errors_and_follows_the_interval(ibex, registered):
    node, path = registered
    ibex.heartbeat_interval_s = 0.02
    ibex.heartbeat_failures = [503, 500]
    stop = threading.Event()
    agent = NodeAgent(ApiClient(ibex.url), load_state(path), path, fake_gpus, lambda: [],
                      interval_s=0.01, stop=stop)
    thread = threading.Thread(target=agent.run_forever)
    thread.start()
    deadline = time.monotonic() + 5
    while len(node.heartbeats) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    thread.join(5)

    assert not thread.is_alive()
    assert len(node.heartbeats) >= 3
    assert agent.interval_s == 0.02
    assert node.heartbeats[0]["gpus"] == [{"index": 0, "temperature_c": 45, "utilization_pct": 80,
                                           "memory_used_mib": 1000, "ecc_errors": 0, "xid_errors": 0}]


def test_the_loop_stops_on_a_refused_token(ibex, registered):
    node, path = registered
    node.token = "revoked"
    agent = NodeAgent(ApiClient(ibex.url), load_state(path), path, fake_gpus, lambda: [], interval_s=0.01)

    with pytest.raises(ApiError) as refused:
        agent.run_forever()
    assert refused.value.status == 401


def test_retry_delay_doubles_and_caps_at_60_seconds():
    assert [retry_delay(15, n) for n in range(5)] == [15, 30, 60, 60, 60]
    assert retry_delay(120, 3) == 120  # never shorter than what the server asked for


def test_sigterm_stops_run_cleanly(ibex, registered):
    node, path = registered
    ibex.heartbeat_interval_s = 0.05
    process = subprocess.Popen(
        [sys.executable, "-m", "agent", "run", "--state", str(path), "--interval", "0.05"],
        cwd=REPO, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": python_path(str(REPO))},
    )
    deadline = time.monotonic() + 10
    while not node.heartbeats and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=10)

    assert process.returncode == 0, err
    assert node.heartbeats
    assert "SIGTERM received; stopping" in err
    assert "Traceback" not in err
    assert json.loads(path.read_text())["node_id"] == node.id


@pytest.mark.parametrize(("flags", "problem"), [
    (["--runtime", "ssh"], "--runtime ssh needs --ssh-port"),
    (["--runtime", "process", "--ssh-port", "2222"], "--ssh-port goes with --runtime ssh"),
    (["--runtime", "ssh", "--ssh-port", "70000"], "not a port"),
])
def test_runtime_flags_are_checked(registered, capsys, flags, problem):
    _, path = registered
    with pytest.raises(SystemExit) as stopped:
        main(["run", "--once", "--state", str(path), *flags])
    assert stopped.value.code == 2
    assert problem in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="--runtime process needs root")
def test_the_default_work_dir_is_beside_the_state_file_and_reachable_by_lease_accounts(ibex, tmp_path, capsys):
    node = ibex.add_node("gpu01")
    base = make_work_dir().parent  # mode 711, as every directory above a work dir must be
    path = base / "state" / "node.json"
    hidden = tmp_path / "node.json"  # under pytest's 700 directories
    for state_path in (path, hidden):
        save_state(state_path, NodeState(api=ibex.url, node_id=node.id, token=node.token, hostname="gpu01"))
    assert os.stat(path.parent).st_mode & 0o777 == 0o700
    try:
        assert main(["run", "--once", "--quiet", "--state", str(path), "--runtime", "process",
                     "--address", "10.0.0.5"]) == 0

        work = path.parent / "work"
        modes = {name: os.stat(work / name).st_mode & 0o777 for name in ("leases", "logs", "run")}
        assert modes == {"leases": 0o711, "logs": 0o700, "run": 0o700}
        assert os.stat(path.parent).st_mode & 0o777 == 0o711 and os.stat(path).st_mode & 0o777 == 0o600
        assert node.heartbeats[-1]["runtime"] == {"kind": "process", "address": "10.0.0.5", "ssh_port": None}

        assert main(["run", "--once", "--quiet", "--state", str(hidden), "--runtime", "process"]) == 1
        assert error_lines(capsys.readouterr().err) == [
            f"ibex-agent: lease accounts cannot reach their homes: {tmp_path.parent} is not searchable "
            f"by others (chmod o+x {tmp_path.parent}, or pick another --work-dir)"]
    finally:
        shutil.rmtree(base, ignore_errors=True)

"""`ibex-agent run --runtime process`, for real, as root: per-lease accounts, the launch
environment, shipped logs, notice and stop, cleanup, and adoption after a restart."""

import os
import pwd
import shutil
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent import cgroups
from agent.launch import parse_launch
from agent.processes import pids_of_uid
from agent.workloads import Runtime
from tests.agent.fake_ibex import FakeIbex
from tests.agent.runtime_helpers import (
    AgentUnderTest,
    account_exists,
    launch,
    make_work_dir,
    needs_root_and_useradd,
    new_lease_id,
    processes_of,
    remove_test_account,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("root")


@pytest.fixture
def root():
    needs_root_and_useradd()


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        server.heartbeat_interval_s = 0.2
        yield server


@pytest.fixture
def leases():
    """Fresh lease ids; their accounts, processes and cgroups are removed whatever happens."""
    used: list[str] = []

    def new() -> str:
        used.append(new_lease_id())
        return used[-1]

    yield new
    for lease in used:
        remove_test_account(lease)


@pytest.fixture
def agent(ibex, tmp_path):
    work_dir = make_work_dir()
    node = ibex.add_node("gpu01")
    under_test = AgentUnderTest(ibex, node, work_dir, tmp_path / "node.json")
    under_test.node = node
    under_test.work_dir = work_dir
    under_test.start()
    yield under_test
    under_test.kill(signal.SIGTERM)
    shutil.rmtree(work_dir.parent, ignore_errors=True)
    assert "Traceback" not in under_test.output()


def workload(agent, lease: str, state: str | None = None):
    """The lease's latest reported workload entry, once it is in `state`."""
    def reported():
        entry = agent.node.workload(lease)
        return entry if entry and (state is None or entry["state"] == state) else None
    return wait_for(reported, what=f"lease {lease} reported {state or 'at all'}:\n{agent.output()}")


def logged(agent, lease: str, text: str, generation: int = 1) -> list[str]:
    def found():
        lines = agent.node.log_lines(lease, generation)
        return lines if any(text in line for line in lines) else None
    return wait_for(found, what=f"{text!r} in lease {lease}'s log: {agent.node.log_lines(lease, generation)}")


def gone(agent, lease: str) -> bool:
    beat = agent.node.heartbeats[-1] if agent.node.heartbeats else {}
    return lease not in beat.get("serving", [lease]) and agent.node.workload(lease) is None


def test_the_command_runs_as_the_lease_account_with_the_launch_env_and_its_log_is_shipped(ibex, leases, agent):
    other, lease = leases(), leases()
    other_home = agent.work_dir / "leases" / f"ibex-l{other}"
    ibex.queue_action(agent.node.id, "start", other, [2], launch=launch(
        command=["bash", "-c", "echo secret > ~/secret; echo ready; sleep 60"]))
    logged(agent, other, "ready")

    ibex.queue_action(agent.node.id, "start", lease, [1, 0], launch=launch(
        command=["bash", "-c", 'echo "user=$(id -un)"; echo "pwd=$(pwd)"; env; '
                 'cat "$OTHER/secret" || echo cannot-read-other; '
                 'echo tmp > /tmp/ibex-test-$IBEX_LEASE_ID; echo shm > /dev/shm/ibex-test-$IBEX_LEASE_ID'],
        env={"WANDB_MODE": "offline", "CUDA_VISIBLE_DEVICES": "7", "OTHER": str(other_home)},
        workdir="runs/a"))

    entry = workload(agent, lease, "exited")
    assert entry["exit_code"] == 0 and entry["generation"] == 1 and entry["error"] == ""
    assert entry["started_at"].endswith("Z") and entry["ended_at"].endswith("Z")
    port = entry["master_port"]
    assert isinstance(port, int) and 0 < port < 65536  # rank 0 picked it
    lines = logged(agent, lease, "cannot-read-other")
    home = agent.work_dir / "leases" / f"ibex-l{lease}"
    for expected in (f"user=ibex-l{lease}", f"pwd={home}/runs/a", f"IBEX_LEASE_ID={lease}", "NODE_RANK=0",
                     "NNODES=1", "GPUS_PER_NODE=2", "MASTER_ADDR=127.0.0.1", f"MASTER_PORT={port}",
                     "IBEX_NODE_ADDRS=127.0.0.1", "CUDA_VISIBLE_DEVICES=0,1", f"HOME={home}",
                     f"USER=ibex-l{lease}", "WANDB_MODE=offline"):
        assert expected in lines, expected
    assert not any("secret" == line for line in lines)
    assert any("Permission denied" in line for line in lines)
    assert agent.node.heartbeats[-1]["runtime"] == {"kind": "process", "address": "127.0.0.1", "ssh_port": None}
    assert "wait_s" in agent.node.heartbeats[-1]

    uids = {stopped: pwd.getpwnam(f"ibex-l{stopped}").pw_uid for stopped in (lease, other)}
    for stopped in (lease, other):
        ibex.queue_action(agent.node.id, "stop", stopped, [], grace_s=2)
    wait_for(lambda: gone(agent, lease) and gone(agent, other), what="both leases dropped")
    for stopped in (lease, other):
        assert pids_of_uid(uids[stopped]) == [] and not account_exists(stopped)
        assert not (agent.work_dir / "leases" / f"ibex-l{stopped}").exists()
        assert not list((agent.work_dir / "logs").glob(f"{stopped}.*"))
    assert not Path(f"/tmp/ibex-test-{lease}").exists() and not Path(f"/dev/shm/ibex-test-{lease}").exists()


def test_notice_sends_sigterm_once_and_the_command_can_checkpoint(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=launch(command=[
        "bash", "-c", 'trap "echo checkpoint saved; exit 0" TERM; echo ready; while true; do sleep 0.1; done']))
    logged(agent, lease, "ready")

    until = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
    ibex.queue_action(agent.node.id, "notice", lease, [0], until=until)

    entry = workload(agent, lease, "stopped")
    assert entry["exit_code"] == 0
    logged(agent, lease, "checkpoint saved")
    assert lease in agent.node.heartbeats[-1]["serving"]  # a notice ends the work, not the lease


def test_a_command_that_ignores_sigterm_is_killed_at_the_notice_deadline(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=launch(command=[
        "bash", "-c", 'trap "echo ignoring TERM" TERM; echo ready; while true; do sleep 0.1; done']))
    logged(agent, lease, "ready")

    until = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    ibex.queue_action(agent.node.id, "notice", lease, [0], until=until)

    entry = workload(agent, lease, "stopped")
    assert entry["exit_code"] == 128 + signal.SIGKILL
    assert "ignoring TERM" in agent.node.log_lines(lease)


def test_a_command_that_cannot_start_is_failed_with_the_reason(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=launch(command=["no-such-command-xyz"]))

    entry = workload(agent, lease, "failed")
    assert entry["exit_code"] == 127
    assert entry["error"] == "command not found: no-such-command-xyz"


def test_a_restarted_agent_adopts_the_running_command_and_never_starts_it_twice(ibex, leases, agent):
    lease = leases()
    start = launch(command=["bash", "-c", 'echo start >> ~/starts; echo "started $$"; sleep 60'])
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=start)
    workload(agent, lease, "running")
    logged(agent, lease, "started")

    agent.kill(signal.SIGKILL)
    beats_before = len(agent.node.heartbeats)
    agent.start()
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=start)  # the server repeats start
    wait_for(lambda: len(agent.node.heartbeats) > beats_before + 5, what="heartbeats from the new agent")

    assert workload(agent, lease)["state"] == "running"
    starts = agent.work_dir / "leases" / f"ibex-l{lease}" / "starts"
    assert starts.read_text() == "start\n"
    assert len([line for line in agent.node.log_lines(lease) if line.startswith("started")]) == 1

    ibex.queue_action(agent.node.id, "stop", lease, [0], grace_s=1)
    wait_for(lambda: gone(agent, lease), what="the lease dropped after stop")
    assert processes_of(lease) == "" and not account_exists(lease)


def test_a_new_generation_replaces_the_running_one(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [0], launch=launch(
        command=["bash", "-c", "echo one > ~/checkpoint; echo first; sleep 60"]))
    logged(agent, lease, "first")

    ibex.queue_action(agent.node.id, "start", lease, [0, 1], launch=launch(
        generation=2, command=["bash", "-c", "echo second; cat ~/checkpoint"], node_rank=1, nnodes=2,
        master_port=29400, node_addrs=["10.0.0.5", "127.0.0.1"], master_addr="10.0.0.5"))

    entry = workload(agent, lease, "exited")
    assert entry["generation"] == 2 and entry["master_port"] is None  # only rank 0 reports one
    assert logged(agent, lease, "one", generation=2)[:2] == ["second", "one"]  # the home stays
    assert agent.node.log_lines(lease, 1)[0] == "first"
    assert not list((agent.work_dir / "run").glob(f"{lease}.1.*"))
    assert os.path.exists(agent.work_dir / "leases" / f"ibex-l{lease}")


def test_without_cgroups_the_process_group_is_signalled_and_stop_kills_what_escaped_it(leases, monkeypatch):
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", Path("/nonexistent-cgroup-root"))
    work_dir = make_work_dir()
    runtime = Runtime("process", "127.0.0.1", work_dir, node_id=1)
    lease = leases()
    try:
        runtime.prepare()
        runtime.start(lease, [0], parse_launch(launch(
            command=["bash", "-c", "setsid sleep 300 & echo ready; sleep 300"])))
        assert runtime.workloads[lease].cgroup is None
        uid = pwd.getpwnam(f"ibex-l{lease}").pw_uid
        wait_for(lambda: len(pids_of_uid(uid)) >= 2, what="both sleeps (bash execs the last one)")

        runtime.stop(lease, grace_s=5)
        assert runtime.tearing_down() == {lease}
        wait_for(lambda: runtime.tick() or lease not in runtime.workloads, what="the lease cleaned up")

        assert pids_of_uid(uid) == [] and not account_exists(lease)
        assert not (work_dir / "leases" / f"ibex-l{lease}").exists()
    finally:
        shutil.rmtree(work_dir.parent, ignore_errors=True)


def test_the_command_runs_fenced_off_the_nodes_other_gpus_and_the_fence_goes_with_it(leases):
    if not (cgroups.CGROUP_ROOT / "devices" / "devices.deny").exists():
        pytest.skip("no writable cgroup v1 devices hierarchy to fence GPUs with")
    work_dir = make_work_dir()
    runtime = Runtime("process", "127.0.0.1", work_dir, node_id=1)
    runtime.gpus_on_node = 4
    lease = leases()
    try:
        runtime.prepare()
        runtime.start(lease, [2], parse_launch(launch(command=["sleep", "300"])))
        fence = Path(runtime.workloads[lease].device_cgroup)
        uid = pwd.getpwnam(f"ibex-l{lease}").pw_uid
        wait_for(lambda: pids_of_uid(uid), what="the command")
        assert set(pids_of_uid(uid)) <= {int(pid) for pid in
                                          (fence / "cgroup.procs").read_text().split()}

        runtime.stop(lease, grace_s=5)
        wait_for(lambda: runtime.tick() or lease not in runtime.workloads, what="the lease cleaned up")

        assert not fence.exists()
    finally:
        shutil.rmtree(work_dir.parent, ignore_errors=True)

"""A real `ibex-agent run --runtime process` (as root) running leases on parts of GPUs: a share's
command sees MPS's limits, and a slice this node cannot make (no NVML here) fails the command
with the reason instead of running it on the whole GPU."""

import os
import shutil
import signal

import pytest

from tests.agent.fake_ibex import FakeIbex
from tests.agent.runtime_helpers import (
    AgentUnderTest,
    launch,
    make_work_dir,
    needs_root_and_useradd,
    new_lease_id,
    remove_test_account,
    wait_for,
)


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        server.heartbeat_interval_s = 0.2
        yield server


@pytest.fixture
def leases():
    used: list[str] = []

    def new() -> str:
        used.append(new_lease_id())
        return used[-1]

    yield new
    for lease in used:
        remove_test_account(lease)


@pytest.fixture
def agent(ibex, tmp_path, monkeypatch):
    needs_root_and_useradd()
    pipes = make_work_dir().parent / "mps"
    pipes.mkdir()
    os.mkfifo(pipes / "control")  # as the MPS control daemon leaves its pipe directory
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    work_dir = make_work_dir()
    node = ibex.add_node("gpu01")
    under_test = AgentUnderTest(ibex, node, work_dir, tmp_path / "node.json")
    under_test.node = node
    under_test.pipes = pipes
    under_test.start()
    yield under_test
    under_test.kill(signal.SIGTERM)
    shutil.rmtree(work_dir.parent, ignore_errors=True)
    shutil.rmtree(pipes.parent, ignore_errors=True)
    assert "Traceback" not in under_test.output()


def reported(agent, lease: str, state: str) -> dict:
    def found():
        entry = agent.node.workload(lease)
        return entry if entry and entry["state"] == state else None
    return wait_for(found, what=f"lease {lease} {state}:\n{agent.output()}")


def test_a_shares_command_runs_with_mps_limits_and_the_share_is_reported_enforced(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [3], parts=[{"index": 3, "share": 250, "memory_mib": 20480}],
                      launch=launch(command=["bash", "-c", "env"]))

    reported(agent, lease, "exited")
    lines = wait_for(lambda: agent.node.log_lines(lease) or None, what="the log")
    for expected in ("CUDA_VISIBLE_DEVICES=3", "GPUS_PER_NODE=1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
                     "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M", f"CUDA_MPS_PIPE_DIRECTORY={agent.pipes}"):
        assert expected in lines, expected
    assert agent.node.heartbeats[-1]["devices"] == {lease: [
        {"index": 3, "share": 250, "memory_mib": 20480, "enforced": True, "error": ""}]}


def test_a_slice_that_could_not_be_made_fails_the_command_with_nvmls_reason(ibex, leases, agent):
    lease = leases()
    ibex.queue_action(agent.node.id, "start", lease, [0], parts=[{"index": 0, "mig_profile": "1g.10gb", "start": 0}],
                      launch=launch(command=["bash", "-c", "echo ran"]))

    entry = reported(agent, lease, "failed")
    assert entry["error"].startswith("MIG slice 1g.10gb at slot 0 of GPU 0 is not set up: NVML is not available")
    device = agent.node.heartbeats[-1]["devices"][lease][0]
    assert device["enforced"] is False and device["uuid"] == ""
    assert device["error"].startswith("NVML is not available") and device["error"].endswith("MIG slice not created")

    ibex.queue_action(agent.node.id, "stop", lease, [0], grace_s=0)
    wait_for(lambda: agent.node.heartbeats[-1]["serving"] == [], what="the lease dropped")
    assert "devices" not in agent.node.heartbeats[-1]

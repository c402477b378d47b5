"""`ibex-agent run --runtime ssh`, for real: the agent's sshd lets a lease's key in as the lease
account, in its workdir with the launch environment, and refuses any other key."""

import os
import shutil
import signal
import subprocess

import pytest

from tests.agent.fake_ibex import FakeIbex
from tests.agent.runtime_helpers import (
    AgentUnderTest,
    account_exists,
    free_port,
    launch,
    make_work_dir,
    needs_root_and_useradd,
    new_lease_id,
    remove_test_account,
    wait_for,
)


@pytest.fixture
def ssh_ready():
    needs_root_and_useradd()
    if not os.access("/usr/sbin/sshd", os.X_OK):
        pytest.skip("the ssh runtime needs /usr/sbin/sshd (package openssh-server)")
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"the ssh runtime test needs {tool} (package openssh-client)")


def make_key(path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def ssh(key, port: int, lease: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
         f"ibex-l{lease}@127.0.0.1", command],
        capture_output=True, text=True, timeout=30,
    )


def test_a_lease_key_logs_in_to_the_lease_account_and_another_key_is_refused(ssh_ready, tmp_path):
    lease = new_lease_id()
    port = free_port()
    work_dir = make_work_dir()
    public = make_key(tmp_path / "tenant")
    make_key(tmp_path / "stranger")
    with FakeIbex() as ibex:
        ibex.heartbeat_interval_s = 0.2
        node = ibex.add_node("gpu01")
        agent = AgentUnderTest(ibex, node, work_dir, tmp_path / "node.json", runtime="ssh",
                               extra=["--ssh-port", str(port)])
        try:
            agent.start()
            ibex.queue_action(node.id, "start", lease, [0, 1], launch=launch(
                command=None, ssh_keys=[public], workdir="runs/a", env={"WANDB_MODE": "offline"}))
            home = work_dir / "leases" / f"ibex-l{lease}"
            wait_for(lambda: (home / ".ssh" / "authorized_keys").exists() and node.heartbeats
                     and lease in node.heartbeats[-1]["serving"], what=f"the lease's keys:\n{agent.output()}")
            assert node.heartbeats[-1]["runtime"] == {"kind": "ssh", "address": "127.0.0.1", "ssh_port": port}
            assert node.workload(lease) is None  # no command: nothing to report

            login = ssh(tmp_path / "tenant", port, lease, "echo $NODE_RANK; pwd; ls -a ~; id -un; "
                                                          "echo $CUDA_VISIBLE_DEVICES $WANDB_MODE")
            assert login.returncode == 0, login.stderr + agent.output()
            lines = login.stdout.split()
            assert lines[0] == "0" and lines[1] == f"{home}/runs/a"
            assert {".ibex", ".ssh", "runs"} <= set(lines) and f"ibex-l{lease}" in lines
            assert lines[-2:] == ["0,1", "offline"]

            refused = ssh(tmp_path / "stranger", port, lease, "true")
            assert refused.returncode == 255 and "Permission denied" in refused.stderr

            ibex.queue_action(node.id, "stop", lease, [], grace_s=1)
            wait_for(lambda: lease not in node.heartbeats[-1]["serving"], what="the lease dropped")
            assert not account_exists(lease) and not home.exists()
        finally:
            agent.kill(signal.SIGTERM)
            remove_test_account(lease)
            shutil.rmtree(work_dir.parent, ignore_errors=True)
        assert "Traceback" not in agent.output()
        assert "sshd listens on 127.0.0.1" in agent.output()

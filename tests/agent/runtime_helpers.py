"""Running a real `ibex-agent run --runtime process|ssh` against the fake server, as root.

Each test gets lease ids no other test (or earlier run) uses, a work dir lease accounts can
reach (pytest's tmp dirs are 700), and a cleanup that removes the accounts even when the test
failed half way.
"""

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent import accounts, cgroups
from agent.processes import kill_uid
from agent.state import NodeState, save_state
from tests.clock import python_path

REPO = Path(__file__).resolve().parents[2]


def needs_root_and_useradd():
    if os.geteuid() != 0:
        pytest.skip("the process runtime creates Unix accounts: needs root")
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            pytest.skip(f"the process runtime needs {tool} (package passwd)")


def wait_for(condition, timeout_s: float = 20.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def new_lease_id() -> str:
    return str(random.randint(10**8, 10**9 - 1))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(generation: int = 1, command=None, **fields) -> dict:
    return {"generation": generation, "command": command, "env": {}, "workdir": "",
            "ssh_keys": [], "node_rank": 0, "nnodes": 1, "node_addrs": ["127.0.0.1"],
            "master_addr": "127.0.0.1", "master_port": None, **fields}


def account_exists(lease: str) -> bool:
    try:
        pwd.getpwnam(f"ibex-l{lease}")
    except KeyError:
        return False
    return True


def processes_of(lease: str) -> str:
    """`ps -u` of the lease account: empty when it has none (or no longer exists)."""
    if not account_exists(lease):
        return ""
    result = subprocess.run(["ps", "-o", "pid=,args=", "-u", f"ibex-l{lease}"], capture_output=True, text=True)
    return result.stdout.strip()


def remove_test_account(lease: str) -> None:
    name = f"ibex-l{lease}"
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        uid = None
    if uid is not None:
        kill_uid(uid)
        subprocess.run(["userdel", name], capture_output=True)
    shutil.rmtree(accounts.USERS_DIR / name, ignore_errors=True)  # agents' marks of its use
    for base in [*cgroups.candidates(), cgroups.CGROUP_ROOT / "devices"]:
        for path in (base / cgroups.PARENT).glob(f"*-{name}-g*"):
            cgroups.kill_and_remove(path)


class AgentUnderTest:
    """`python -m agent run` in a subprocess, so that it can be killed and started again."""

    def __init__(self, ibex, node, work_dir: Path, state_path: Path, runtime: str = "process",
                 extra: list[str] | None = None) -> None:
        save_state(state_path, NodeState(api=ibex.url, node_id=node.id, token=node.token, hostname="gpu01"))
        self.argv = [sys.executable, "-m", "agent", "run", "--state", str(state_path), "--interval", "0.2",
                     "--runtime", runtime, "--address", "127.0.0.1", "--work-dir", str(work_dir), *(extra or [])]
        self.process: subprocess.Popen | None = None
        self.log = state_path.with_name("agent.log")

    def start(self) -> None:
        with open(self.log, "ab") as output:
            self.process = subprocess.Popen(
                self.argv, cwd=REPO, stdout=output, stderr=output,
                env={**os.environ, "PYTHONPATH": python_path(str(REPO))},
            )

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(15)

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def make_work_dir() -> Path:
    """A work dir every lease account can traverse to its home (mode 711 up to /)."""
    path = Path(tempfile.mkdtemp(prefix="ibex-agent-test-", dir="/var/tmp"))
    path.chmod(0o711)
    return path / "work"

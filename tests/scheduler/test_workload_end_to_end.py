"""A tenant's command on a 2-node lease, with real parts: the API over HTTP, a real Celery
worker placing the lease, and two real `ibex-agent run --runtime process` agents on this host
(distinct hostnames and state directories) that start one rank each as the lease's own Unix
account. Rank 1 connects to rank 0 over MASTER_ADDR:MASTER_PORT; both ranks' output comes back
through the logs API; terminating the lease leaves no account or process behind."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from billing import services as money
from ibex.accounts import services as accounts
from market import leasing, prices
from market.models import Lease
from pool.models import Binding, Node
from tests.agent.runtime_helpers import make_work_dir, remove_test_account
from tests.market.inventory import provider_with_nodes

DEADLINE_S = 90

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("useradd"),
    reason="the process runtime creates a Unix account per lease: it needs root and useradd")

RANKS = r"""
import os, socket, time
rank, addr, port = int(os.environ["NODE_RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"rank {rank} of {os.environ['NNODES']} as {os.environ['USER']} on GPUs "
      f"{os.environ['CUDA_VISIBLE_DEVICES']}, master {addr}:{port}, "
      f"nodes {os.environ['IBEX_NODE_ADDRS']}, greeting {os.environ['GREETING']}", flush=True)
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(60)
    peer, _ = server.accept()
    print("rank 0 heard:", peer.recv(100).decode(), flush=True)
else:
    for _ in range(600):
        try:
            sock = socket.create_connection((addr, port), timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    sock.sendall(b"hello from rank 1")
    print(f"rank 1 connected to {addr}:{port}", flush=True)
"""


def wait_for(check, what: str, last=lambda: ""):
    deadline = time.monotonic() + DEADLINE_S
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {last()}")
        time.sleep(0.2)
    return result


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def agent(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent", *args], **kwargs)


class Exchange:
    """A provider whose nodes are real agents on this host, and a funded tenant's API session."""

    def __init__(self, live_server, tmp_path, hosts: dict[str, list[str]]):
        provider = provider_with_nodes(nodes=len(hosts))  # hpc-provider-01, ..., registered
        prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                          actor="test")
        self.provider_key = accounts.issue_api_key(organization=provider,
                                                   scopes=["read", "provide"]).raw_key
        tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",))
        money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t",
                           actor="t")
        self.url = live_server.url
        self.api = requests.Session()
        self.api.headers["Authorization"] = "Bearer " + accounts.issue_api_key(
            organization=tenant, scopes=["read", "trade"]).raw_key
        self.hosts, self.tmp_path = hosts, tmp_path
        self.agents: list[subprocess.Popen] = []
        self.work_dirs = make_work_dir().parent  # lease accounts must reach their homes: 711

    def __enter__(self) -> "Exchange":
        for host, runtime in self.hosts.items():
            state = self.tmp_path / host / "node.json"
            registered = subprocess.run(
                [sys.executable, "-m", "agent", "register", "--api", self.url,
                 "--key", self.provider_key, "--fabric", "lab", "--hostname", host,
                 "--gpu-model", "H100-80GB", "--gpus", "8", "--cpu-cores", "64",
                 "--memory-gib", "1024", "--state", str(state), "--quiet"],
                capture_output=True, text=True, timeout=60)
            assert registered.returncode == 0, registered.stderr
            self.agents.append(agent("run", "--state", str(state), *runtime,
                                     "--address", "127.0.0.1", "--simulate-gpus", "8",
                                     "--work-dir", str(self.work_dirs / host), "--quiet"))
        wait_for(lambda: Node.objects.filter(state="active").exclude(runtime="none").count()
                 == len(self.hosts), "the agents to report their runtimes")
        return self

    def __exit__(self, *exc) -> None:
        for process in self.agents:
            process.terminate()
        for process in self.agents:
            process.wait(timeout=60)
        # a stopped agent leaves its leases running (a restarted one adopts them): a test that
        # failed midway must not leave their accounts to the next run
        for ref in set(Binding.objects.values_list("lease_ref", flat=True)):
            remove_test_account(ref.removeprefix("L-"))
        shutil.rmtree(self.work_dirs, ignore_errors=True)

    def get(self, path: str, **params):
        return self.api.get(f"{self.url}/api/v1/{path}", params=params, timeout=30).json()

    def post(self, path: str, body: dict | None = None):
        return self.api.post(f"{self.url}/api/v1/{path}", json=body, timeout=30).json()


@pytest.mark.django_db(transaction=True)
def test_a_two_node_lease_runs_its_command_on_each_node_and_the_ranks_find_each_other(
        live_server, celery_worker_process, tmp_path):
    hosts = {"hpc-provider-01": ["--runtime", "process"],
             "hpc-provider-02": ["--runtime", "process"]}
    with Exchange(live_server, tmp_path, hosts) as exchange:
        order = exchange.post("orders/", {
            "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", "topology": {"required": "leaf"},
            "workload": {"command": ["python3", "-c", RANKS], "env": {"GREETING": "hi"}}})
        lease_id = order["lease"]

        def lease():
            return exchange.get(f"leases/{lease_id}/")

        def logs(rank):
            return exchange.get(f"leases/{lease_id}/logs/", node_rank=rank)["lines"]

        wait_for(lambda: lease()["workload"]["state"] == "exited", "both ranks to exit")
        rank_zero, rank_one = wait_for(lambda: (lambda a, b: (a, b) if len(a) > 1 and len(b) > 1
                                                else None)(logs(0), logs(1)), "their output")
        shown = lease()
        account = f"ibex-l{lease_id}"

        assert shown["state"] == "active"
        assert [(n["node"], n["node_rank"], n["state"], n["exit_code"])
                for n in shown["workload"]["nodes"]] == [
            ("hpc-provider-01", 0, "exited", 0), ("hpc-provider-02", 1, "exited", 0)]
        port = Binding.objects.get(lease_ref=f"L-{lease_id}", node_rank=0).master_port
        assert rank_zero[0] == (f"rank 0 of 2 as {account} on GPUs 0,1,2,3,4,5,6,7, "
                                f"master 127.0.0.1:{port}, nodes 127.0.0.1,127.0.0.1, greeting hi")
        assert rank_zero[1] == "rank 0 heard: hello from rank 1"
        assert rank_one[1] == f"rank 1 connected to 127.0.0.1:{port}"

        exchange.post(f"leases/{lease_id}/terminate/")
        wait_for(lambda: not Binding.objects.filter(lease_ref=f"L-{lease_id}",
                                                    stopped_at__isnull=True).exists(),
                 "both agents to stop serving the lease")
        assert subprocess.run(["getent", "passwd", account]).returncode == 2  # no such account
        assert subprocess.run(["pgrep", "-u", account], capture_output=True).stdout == b""
        assert Lease.objects.get(pk=lease_id).state == "terminated"


def keypair(path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def ssh(line: str, key, command: str) -> subprocess.CompletedProcess:
    """Run the access line the API gave, with the tenant's key, non-interactively."""
    return subprocess.run(
        [*line.split()[:3], "-i", str(key), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "LogLevel=ERROR", line.split()[3], command],
        capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(),
                    reason="the ssh runtime runs OpenSSH's sshd: apt-get install openssh-server")
@pytest.mark.django_db(transaction=True)
def test_a_tenant_logs_into_its_lease_with_its_key_and_a_rival_key_is_refused(
        live_server, celery_worker_process, tmp_path):
    port = free_port()
    alice, rival = keypair(tmp_path / "alice"), keypair(tmp_path / "rival")
    assert alice != rival
    hosts = {"hpc-provider-01": ["--runtime", "ssh", "--ssh-port", str(port)]}
    with Exchange(live_server, tmp_path, hosts) as exchange:
        lease_id = exchange.post("orders/", {
            "gpu_models": ["H100-80GB"], "gpus": 4, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", "ssh_keys": [alice]})["lease"]
        wait_for(lambda: exchange.get(f"leases/{lease_id}/")["state"] == "active",
                 "the lease to be active")
        [access] = exchange.get(f"leases/{lease_id}/")["access"]
        line = access["ssh"]

        tries = []

        def login():
            tries.append(ssh(line, tmp_path / "alice", "echo $USER $NODE_RANK "
                             "$CUDA_VISIBLE_DEVICES; ls -a ~; cat /etc/shadow 2>&1 || true"))
            return tries[-1] if tries[-1].returncode == 0 else None

        inside = wait_for(login, "a login with alice's key", lambda: tries[-1])
        refused = ssh(line, tmp_path / "rival", "true")

        assert line == f"ssh -p {port} ibex-l{lease_id}@127.0.0.1"
        user, rank, gpus = inside.stdout.splitlines()[0].split()
        assert (user, rank) == (f"ibex-l{lease_id}", "0")
        assert len(gpus.split(",")) == 4
        assert ".ssh" in inside.stdout.split()  # its own home
        assert "Permission denied" in inside.stdout  # not root: /etc/shadow stays closed
        assert refused.returncode == 255 and "Permission denied" in refused.stderr

        exchange.post(f"leases/{lease_id}/terminate/")
        wait_for(lambda: not Binding.objects.filter(lease_ref=f"L-{lease_id}",
                                                    stopped_at__isnull=True).exists(),
                 "the agent to stop serving the lease")
        assert ssh(line, tmp_path / "alice", "true").returncode == 255  # the account is gone


@pytest.mark.django_db(transaction=True)
def test_a_preempted_lease_gets_sigterm_at_the_notice_and_can_checkpoint(
        live_server, celery_worker_process, tmp_path):
    hosts = {"hpc-provider-01": ["--runtime", "process"]}
    with Exchange(live_server, tmp_path, hosts) as exchange:
        lease_id = exchange.post("orders/", {
            "gpu_models": ["H100-80GB"], "gpus": 2, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", "workload": {"command": [
                "bash", "-c", 'trap "echo checkpoint saved; exit 0" TERM; echo training; '
                              'while true; do sleep 0.1; done']}})["lease"]

        def logs():
            return exchange.get(f"leases/{lease_id}/logs/", node_rank=0)["lines"]

        wait_for(lambda: logs() == ["training"], "the command to start")
        wait_for(lambda: Lease.objects.get(pk=lease_id).state == "active", "the lease active")
        lease = Lease.objects.get(pk=lease_id)
        leasing.give_notice(lease=lease, reason="outbid by a higher bid", now=timezone.now(),
                            actor="market")  # as an auction or a pool's reclaim does

        # (bash may also say its `sleep` was Terminated: SIGTERM goes to the whole cgroup)
        wait_for(lambda: "checkpoint saved" in logs(), "the checkpoint line", logs)
        rank = wait_for(lambda: (lambda n: n if n["state"] == "stopped" else None)(
            exchange.get(f"leases/{lease_id}/")["workload"]["nodes"][0]), "the rank to stop")
        shown = exchange.get(f"leases/{lease_id}/")

        assert shown["state"] == "preempting"  # it ends at preempt_at; its command already has
        assert (rank["state"], rank["exit_code"]) == ("stopped", 0)
        assert shown["workload"]["state"] == "stopped"

        exchange.post(f"leases/{lease_id}/terminate/")
        wait_for(lambda: not Binding.objects.filter(lease_ref=f"L-{lease_id}",
                                                    stopped_at__isnull=True).exists(),
                 "the agent to remove the lease")
        assert subprocess.run(["getent", "passwd", f"ibex-l{lease_id}"]).returncode == 2

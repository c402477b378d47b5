"""A tenant's command on a 2-node lease, with real parts: the API over HTTP, a real Celery
worker placing the lease, and two real `ibex-agent run --runtime process` agents on this host
(distinct hostnames and state directories) that start one rank each as the lease's own Unix
account. Rank 1 connects to rank 0 over MASTER_ADDR:MASTER_PORT; both ranks' output comes back
through the logs API; terminating the lease leaves no account or process behind."""

import os
import shutil
import subprocess
import sys
import time

import pytest
import requests

from billing import services as money
from ibex.accounts import services as accounts
from market import prices
from market.models import Lease
from pool.models import Binding, Node
from tests.agent.runtime_helpers import make_work_dir
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


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return result


def agent(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent", *args], **kwargs)


@pytest.mark.django_db(transaction=True)
def test_a_two_node_lease_runs_its_command_on_each_node_and_the_ranks_find_each_other(
        live_server, celery_worker_process, tmp_path):
    provider = provider_with_nodes(nodes=2)  # hpc-provider-01 and -02, registered
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",))
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=["read", "trade"])
    api = requests.Session()
    api.headers["Authorization"] = f"Bearer {tenant_key.raw_key}"
    agents = []
    work_dirs = make_work_dir().parent  # lease accounts must reach their homes: mode 711
    try:
        for host in ("hpc-provider-01", "hpc-provider-02"):
            state = tmp_path / host / "node.json"
            registered = subprocess.run(
                [sys.executable, "-m", "agent", "register", "--api", live_server.url,
                 "--key", provider_key.raw_key, "--fabric", "lab", "--hostname", host,
                 "--gpu-model", "H100-80GB", "--gpus", "8", "--cpu-cores", "64",
                 "--memory-gib", "1024", "--state", str(state), "--quiet"],
                capture_output=True, text=True, timeout=60)
            assert registered.returncode == 0, registered.stderr
            agents.append(agent("run", "--state", str(state), "--runtime", "process",
                                "--address", "127.0.0.1", "--simulate-gpus", "8", "--work-dir",
                                str(work_dirs / host), "--quiet"))
        wait_for(lambda: Node.objects.filter(state="active", runtime="process").count() == 2,
                 "both agents to report the process runtime")

        order = api.post(f"{live_server.url}/api/v1/orders/", json={
            "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", "topology": {"required": "leaf"},
            "workload": {"command": ["python3", "-c", RANKS], "env": {"GREETING": "hi"}}},
            timeout=30).json()
        lease_id = order["lease"]

        def lease():
            return api.get(f"{live_server.url}/api/v1/leases/{lease_id}/", timeout=30).json()

        def logs(rank):
            return api.get(f"{live_server.url}/api/v1/leases/{lease_id}/logs/",
                           params={"node_rank": rank}, timeout=30).json()["lines"]

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
        assert rank_zero[0] == (f"rank 0 of 2 as {account} on GPUs 0,1,2,3,4,5,6,7, master 127.0.0.1:{port},"
                                f" nodes 127.0.0.1,127.0.0.1, greeting hi")
        assert rank_zero[1] == "rank 0 heard: hello from rank 1"
        assert rank_one[1] == f"rank 1 connected to 127.0.0.1:{port}"

        api.post(f"{live_server.url}/api/v1/leases/{lease_id}/terminate/", timeout=30)
        wait_for(lambda: not Binding.objects.filter(lease_ref=f"L-{lease_id}",
                                                    stopped_at__isnull=True).exists(),
                 "both agents to stop serving the lease")
        assert subprocess.run(["getent", "passwd", account]).returncode == 2  # no such account
        assert subprocess.run(["pgrep", "-u", account], capture_output=True).stdout == b""
        assert Lease.objects.get(pk=lease_id).state == "terminated"
    finally:
        for process in agents:
            process.terminate()
        for process in agents:
            process.wait(timeout=60)
        shutil.rmtree(work_dirs, ignore_errors=True)

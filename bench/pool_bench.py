"""Pool at scale, through the real HTTP API served by gunicorn:
register 12,500 nodes x 8 GPUs with the bulk endpoint, then sustain node heartbeats.

    python bench/pool_bench.py [--nodes 12500] [--seconds 15] [--clients 4] [--web-workers 3]

Uses DATABASE_URL / REDIS_URL (or the embedded services) and removes what it created.
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402

from fabric import services as fabric_services  # noqa: E402
from fabric.core import generators  # noqa: E402
from fabric.models import Fabric  # noqa: E402
from ibex.accounts import services as accounts  # noqa: E402
from ibex.accounts.models import Organization  # noqa: E402
from pool.models import Node  # noqa: E402

BULK = 1000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cleanup():
    Node.objects.filter(provider__slug="bench-pool").delete()
    Fabric.objects.filter(name="bench-pool").delete()
    Organization.objects.filter(slug="bench-pool").delete()


def start_web(port: int, workers: int) -> subprocess.Popen:
    env = {**os.environ, "DEBUG": "1", "THROTTLE_USER": "1000000/min"}
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", str(workers), "--log-level", "warning"], cwd=BASE_DIR, env=env)
    for _ in range(200):
        try:
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return web
        except requests.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError("gunicorn did not start")


def heartbeat_worker(url: str, nodes: list, seconds: float, threads: int, counts):
    def loop(mine):
        session = requests.Session()
        body = {"gpus": [{"index": i, "temperature_c": 40, "utilization_pct": 0}
                         for i in range(8)], "ib_ports": [{"port": 1, "state": "active"}]}
        sent = failed = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for node_id, token in mine:
                response = session.post(f"{url}/api/v1/nodes/{node_id}/heartbeat/", json=body,
                                        headers={"Authorization": f"Node {token}"})
                sent += 1
                failed += response.status_code != 200
                if time.monotonic() >= deadline:
                    break
        counts.put((sent, failed))

    workers = [threading.Thread(target=loop, args=(nodes[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


WRK_SCRIPT = """
local nodes = {}
for line in io.lines("%s") do
  local id, token = line:match("(%%d+) (%%S+)")
  nodes[#nodes + 1] = {id, token}
end
local body = '%s'
local counter = 0
request = function()
  counter = counter + 1
  local node = nodes[(counter %% #nodes) + 1]
  return wrk.format("POST", "/api/v1/nodes/" .. node[1] .. "/heartbeat/",
    {["Content-Type"] = "application/json", ["Authorization"] = "Node " .. node[2]}, body)
end
"""


def wrk_heartbeats(url: str, registered: list, seconds: float, web_workers: int) -> None:
    """Load from wrk (a C client): the Python clients would take the cores from the server."""
    import json
    import tempfile

    body = json.dumps({"gpus": [{"index": i, "temperature_c": 40} for i in range(8)],
                       "ib_ports": [{"port": 1, "state": "active"}]})
    with tempfile.TemporaryDirectory() as tmp:
        nodes = Path(tmp) / "nodes.txt"
        nodes.write_text("".join(f"{node_id} {token}\n" for node_id, token in registered))
        script = Path(tmp) / "heartbeat.lua"
        script.write_text(WRK_SCRIPT % (nodes, body))
        out = subprocess.run(["wrk", "-t1", "-c8", f"-d{int(seconds)}s", "-s", str(script), url],
                             capture_output=True, text=True).stdout
    rate = next(line for line in out.splitlines() if "Requests/sec" in line).split()[-1]
    errors = [line.strip() for line in out.splitlines() if "Non-2xx" in line or "errors" in line]
    print(f"heartbeats (wrk, 8 connections, {web_workers} gunicorn workers, same 2 cores): "
          f"{float(rate):.0f}/s {'; '.join(errors) or '(all 200)'}", flush=True)
    latency = next((line.split() for line in out.splitlines() if line.strip().startswith("Latency")), None)
    if latency:
        print(f"   latency mean {latency[1]}, max {latency[3]}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=12_500)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--clients", type=int, default=4, help="heartbeat client processes")
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--steady-nodes", type=int, default=2000)
    args = parser.parse_args()

    cleanup()
    provider = accounts.create_organization(slug="bench-pool", roles=("provider",))
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    spec = generators.fat_tree(args.nodes, 64, tiers=3)
    fabric_services.save_fabric(owner=provider, name="bench-pool", spec=spec, source="generator")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    web = start_web(port, args.web_workers)
    try:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {key}"
        hosts = spec.hosts
        started = time.perf_counter()
        registered = []
        for first in range(0, len(hosts), BULK):
            items = [{"hostname": h, "fabric": "bench-pool", "gpu_model": "H100-80GB",
                      "gpu_count": 8, "cpu_cores": 128, "memory_gib": 2048}
                     for h in hosts[first:first + BULK]]
            response = session.post(f"{url}/api/v1/nodes/bulk/", json={"nodes": items})
            response.raise_for_status()
            registered += [(n["id"], n["token"]) for n in response.json()["nodes"]]
        elapsed = time.perf_counter() - started
        print(f"registered {len(registered)} nodes x 8 GPUs through /api/v1/nodes/bulk/ "
              f"({BULK} per request): {elapsed:.1f} s", flush=True)

        # Steady state: a node's first heartbeat activates it (the slow, locked path); the
        # figure that matters is the heartbeats that follow.
        steady = registered[:args.steady_nodes]
        started = time.perf_counter()
        warm = requests.Session()
        for node_id, token in steady:
            warm.post(f"{url}/api/v1/nodes/{node_id}/heartbeat/",
                      json={"gpus": [{"index": i} for i in range(8)]},
                      headers={"Authorization": f"Node {token}"}).raise_for_status()
        elapsed = time.perf_counter() - started
        print(f"first heartbeats (activation) of {len(steady)} nodes, one client: "
              f"{len(steady) / elapsed:.0f}/s", flush=True)
        registered = steady
        if shutil.which("wrk"):
            wrk_heartbeats(url, registered, args.seconds, args.web_workers)
            return
        counts = multiprocessing.Queue()
        slices = [registered[i::args.clients] for i in range(args.clients)]
        procs = [multiprocessing.Process(target=heartbeat_worker,
                                         args=(url, s, args.seconds, 8, counts)) for s in slices]
        started = time.perf_counter()
        for p in procs:
            p.start()
        results = [counts.get() for _ in range(args.clients * 8)]
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - started
        sent = sum(r[0] for r in results)
        failed = sum(r[1] for r in results)
        print(f"heartbeats: {sent} in {elapsed:.1f} s = {sent / elapsed:.0f}/s "
              f"({failed} failed; {args.web_workers} gunicorn workers, "
              f"{args.clients} client processes x 8 threads on the same 2 cores)", flush=True)
    finally:
        web.terminate()
        web.wait()
        cleanup()


if __name__ == "__main__":
    main()

"""The server's cost of workload logs: ranks shipping 1 MiB/s of output each, as node agents
do (`POST /api/v1/nodes/{id}/logs/`, one request per rank per second), through gunicorn, into
PostgreSQL, trimmed to each rank's last 10 MiB; and a tenant tailing one rank meanwhile.

    python bench/log_shipping_bench.py [--ranks 8] [--seconds 30] [--mib-per-s 1]

Reports the shipments' latency, the web server's CPU per MiB, the tail's lag (a line shipped →
read by the tailing tenant) and what stays in the database. Without DATABASE_URL / REDIS_URL it
runs on the embedded default.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
EMBEDDED = not os.environ.get("DATABASE_URL")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.order_to_active_bench import cpu_of, free_port  # noqa: E402
from fabric import services as fabric_services  # noqa: E402
from fabric.core import generators  # noqa: E402
from ibex.accounts import services as accounts  # noqa: E402
from pool import services as pool  # noqa: E402
from pool.models import WorkloadLog  # noqa: E402

LINE = "step {n:>9} loss 2.3183 lr 3.0e-04 tokens/s 183422 " + "x" * 60  # ~128 bytes


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=8, help="ranks shipping at once")
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--mib-per-s", type=float, default=1.0, help="per rank")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    stamp = int(time.time())
    provider = accounts.create_organization(slug=f"bench-logs-{stamp}", roles=("provider",))
    spec = generators.fat_tree(args.ranks, 32, tiers=2, prefix=f"logs{stamp}-")
    fabric_services.save_fabric(owner=provider, name=f"bench-logs-{stamp}", spec=spec,
                                source="generator")
    registered = pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
        hostname=h, fabric=f"bench-logs-{stamp}", gpu_model="H100-80GB", gpu_count=8,
        cpu_cores=64, memory_gib=1024) for h in spec.hosts])
    ref = f"L-{900_000_000 + stamp % 1_000_000}"  # a lease of no market: the pool only knows refs
    pool.set_lease_bindings(
        wanted={ref: {r.node.pk: list(range(8)) for r in registered}},
        launches={ref: {"command": ["python3", "train.py"], "env": {}, "workdir": "",
                        "ssh_keys": []}})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DEBUG": "1", "THROTTLE_NODE_LOGS": "1000000/min"}  # plain http
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind", f"127.0.0.1:{port}",
         "--workers", "2", "--worker-class", "gthread", "--threads", "16",
         "--log-level", "warning"], cwd=BASE_DIR, env=env)
    try:
        for _ in range(300):
            try:
                requests.get(f"{url}/healthz", timeout=2)
                break
            except requests.RequestException:
                time.sleep(0.2)
        lines_per_s = int(args.mib_per_s * 1024 * 1024 / (len(LINE.format(n=0)) + 1))
        latencies: list[float] = []
        shipped_at: dict[int, float] = {}
        lock = threading.Lock()
        cpu_before = cpu_of(web)

        def ship(rank):
            session = requests.Session()
            session.headers["Authorization"] = f"Node {registered[rank].token}"
            line, deadline = 0, time.monotonic() + args.seconds
            while time.monotonic() < deadline:
                second = time.monotonic()
                batch = [LINE.format(n=n) for n in range(line, line + lines_per_s)]
                sent = time.perf_counter()
                answer = session.post(f"{url}/api/v1/nodes/{registered[rank].node.pk}/logs/",
                                      json={"lease": ref, "generation": 1, "from_line": line,
                                            "lines": batch}, timeout=30)
                answer.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - sent)
                    if rank == 0:
                        shipped_at[line + len(batch) - 1] = time.monotonic()
                line += len(batch)
                time.sleep(max(0.0, 1 - (time.monotonic() - second)))

        lags = []
        tail_done = threading.Event()

        def tail():
            from pool import workloads
            cursor = None
            while not tail_done.is_set():
                page = workloads.read_log(lease_ref=ref, node_rank=0, since=cursor)
                if page.lines:
                    last = int(page.cursor.split(".")[1]) - 1
                    with lock:
                        if last in shipped_at:
                            lags.append(time.monotonic() - shipped_at[last])
                cursor = page.cursor
                if not page.more:
                    time.sleep(0.5)
            connection.close()

        tailer = threading.Thread(target=tail)
        tailer.start()
        shippers = [threading.Thread(target=ship, args=(rank,)) for rank in range(args.ranks)]
        started = time.perf_counter()
        for thread in shippers:
            thread.start()
        for thread in shippers:
            thread.join()
        elapsed = time.perf_counter() - started
        tail_done.set()
        tailer.join()
        cpu = cpu_of(web) - cpu_before
        shipped_mib = args.ranks * args.mib_per_s * args.seconds
        latencies.sort()
        kept = sum(WorkloadLog.objects.filter(binding__lease_ref=ref)
                   .values_list("size_bytes", flat=True))
        print(f"{args.ranks} ranks x {args.mib_per_s:g} MiB/s for {args.seconds} s "
              f"({shipped_mib:.0f} MiB in {len(latencies)} shipments of {lines_per_s} lines, "
              f"{'embedded' if EMBEDDED else 'external'} services, {elapsed:.1f} s)", flush=True)
        print(f"shipment latency p50 {statistics.median(latencies) * 1000:.0f} ms, p95 "
              f"{latencies[int(len(latencies) * 0.95) - 1] * 1000:.0f} ms, max "
              f"{latencies[-1] * 1000:.0f} ms", flush=True)
        print(f"web CPU {cpu:.1f} s = {cpu / shipped_mib:.3f} CPU-s per MiB "
              f"({cpu / elapsed:.2f} cores)", flush=True)
        if lags:
            lags.sort()
            print(f"tail lag (shipped → read) p50 {statistics.median(lags):.2f} s, max "
                  f"{lags[-1]:.2f} s", flush=True)
        print(f"kept in PostgreSQL: {kept / 2**20:.1f} MiB for {args.ranks} ranks "
              f"(budget 10 MiB each)", flush=True)
    finally:
        web.terminate()
        web.wait(timeout=60)


if __name__ == "__main__":
    main()

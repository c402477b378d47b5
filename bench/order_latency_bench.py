"""On-demand order latency through the real API (gunicorn) with the demo's data:
`POST /api/v1/orders/` for 1-16 GPUs, each lease terminated afterwards to keep capacity.

    python bench/order_latency_bench.py [--orders 100]

Without DATABASE_URL / REDIS_URL it runs on the embedded default, like `make demo`.
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
os.environ.setdefault("DEBUG", "1")  # the demo data it measures with is seeded only in DEBUG
EMBEDDED = not os.environ.get("DATABASE_URL")  # the settings export the embedded URLs

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402

from ibex.runtime import var_dir  # noqa: E402
from pool import services as pool  # noqa: E402
from pool.models import Node  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--orders", type=int, default=100)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    call_command("seed_demo", verbosity=0)
    for node in Node.objects.filter(state="registering"):  # as the agents' first heartbeats do
        pool.record_heartbeat(node=node, gpus=[{"index": i} for i in range(8)], ib_ports=[],
                              serving=[])
    credentials = json.loads((var_dir() / "demo" / "credentials.json").read_text())
    key = credentials["acme-ai"]["key"]
    port = free_port()
    env = {**os.environ, "DEBUG": "1", "THROTTLE_USER": "1000000/min"}
    web = subprocess.Popen([sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind",
                            f"127.0.0.1:{port}", "--workers", "2", "--log-level", "warning"],
                           cwd=BASE_DIR, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                requests.get(f"{url}/healthz", timeout=5)
                break
            except requests.RequestException:
                time.sleep(0.1)
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {key}"
        rng = random.Random(1)
        latencies, states = [], {}
        for n in range(args.orders):
            body = {"gpu_models": ["H100-80GB"], "gpus": rng.choice([1, 2, 4, 8, 16]),
                    "hours": 1, "tier": "on_demand", "max_price_per_gpu_hour": "5.00",
                    "topology": {"preferred": "leaf"}}
            started = time.perf_counter()
            answer = session.post(f"{url}/api/v1/orders/", json=body,
                                  headers={"Idempotency-Key": f"bench-{time.time()}-{n}"})
            latencies.append((time.perf_counter() - started) * 1000)
            state = answer.json().get("state", answer.status_code)
            states[state] = states.get(state, 0) + 1
            if answer.ok and answer.json().get("lease"):
                session.post(f"{url}/api/v1/leases/{answer.json()['lease']}/terminate/")
        latencies.sort()
        print(f"on-demand orders through the API ({args.orders}, 1-16 H100s, demo data, "
              f"{'embedded' if EMBEDDED else 'external'} services): "
              f"median {statistics.median(latencies):.1f} ms, "
              f"p95 {latencies[int(len(latencies) * 0.95) - 1]:.1f} ms; outcomes {states}")
    finally:
        web.terminate()
        web.wait()


if __name__ == "__main__":
    main()

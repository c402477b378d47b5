"""Load test: 50 tenants browse markets and leases and place orders against gunicorn with 4
workers on loopback, for 5 minutes (`make load`); locust drives them (bench/load/locustfile.py).

    python bench/load.py [--seconds 300] [--users 50] [--database-url URL] [--json FILE]

Needs DATABASE_URL and REDIS_URL (the real services). Without --database-url it creates a
database of its own on DATABASE_URL's server (ibex_load_<random>), migrates and seeds it, and
drops it afterwards; with --database-url it uses that one as it is (already migrated; the CI
smoke passes the test database). Seed: a verified provider with 64 nodes x 8 H100 at $2.00 a
GPU-hour, and one organisation with an API key and $1M of credit per simulated tenant. A real
Celery worker (a queue of its own) places the leases. Ports: free ones, never 8000.

Prints one JSON line: per group (reads, orders, other writes) requests, errors, requests/s,
p50/p95/p99/max in ms; targets: p99 < 300 ms for reads, < 500 ms for orders, no errors.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
TARGETS_MS = {"reads": 300, "orders": 500}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _admin_connection(url: str):
    import psycopg

    parts = urlsplit(url)
    return psycopg.connect(urlunsplit(parts._replace(path="/postgres")), autocommit=True)


def _wait_http(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=2)
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not start") from None
            time.sleep(0.3)


def seed(users: int) -> list[str]:
    from fabric import services as fabric_services
    from fabric.core import generators
    from ibex.accounts import services as accounts
    from market import prices
    from pool import services as pool
    from pool.models import Gpu, Node
    from tests.factories import fund, make_org

    pool.ensure_gpu_catalogue()
    provider = make_org("load-provider", "provider")
    accounts.change_provider_state(organization=provider, to_state="verified", actor="load",
                                   reason="load test")
    spec = generators.fat_tree(64, 16, tiers=2, prefix="load-")
    fabric_services.save_fabric(owner=provider, name="load-lab", spec=spec, source="generator")
    pool.register_nodes(provider=provider, specs=[
        pool.NodeSpec(hostname=host, fabric="load-lab", gpu_model="H100-80GB", gpu_count=8,
                      cpu_cores=64, memory_gib=1024) for host in spec.hosts])
    Node.objects.filter(provider=provider).update(state="active")  # as their agents would
    Gpu.objects.filter(node__provider=provider).update(health="ok")  # first heartbeats
    prices.set_prices(provider=provider, scope={"fabric": "load-lab"}, price_micros=2_000_000,
                      actor="load")
    keys = []
    for n in range(users):
        tenant = make_org(f"load-tenant-{n:03d}", "tenant")
        fund(tenant, "1000000")
        keys.append(accounts.issue_api_key(organization=tenant, scopes=["read", "trade"]).raw_key)
    return keys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--users", type=int, default=50)
    parser.add_argument("--spawn-rate", type=float, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    server = os.environ.get("DATABASE_URL")
    if not (server or args.database_url) or not os.environ.get("REDIS_URL"):
        sys.exit("bench/load.py: set DATABASE_URL and REDIS_URL (the real services)")
    own_database = args.database_url is None
    url = args.database_url
    if own_database:
        name = f"ibex_load_{uuid.uuid4().hex[:8]}"
        with _admin_connection(server) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = urlunsplit(urlsplit(server)._replace(path=f"/{name}"))
    queue = f"load-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DATABASE_URL": url, "CELERY_QUEUE": queue, "DEBUG": "0",
           "SECURE_SSL_REDIRECT": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost",
           "DJANGO_SETTINGS_MODULE": "ibex.settings", "LOG_LEVEL": "WARNING"}
    os.environ.update(env)
    processes: list[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="ibex-load-"))
    try:
        if own_database:
            subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=BASE_DIR,
                           env=env, check=True)
        import django

        django.setup()
        from django.db import connections

        from ibex.celery import app

        keys = seed(args.users)
        connections.close_all()
        queues = [q.name for q in (app.conf.task_queues or [])] or [queue]
        log = (work / "services.log").open("w")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "ibex", "worker", "--pool", "solo",
             "--queues", ",".join(queues), "--hostname", f"{queue}@%h", "--loglevel",
             "warning", "--without-mingle", "--without-gossip"],
            cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT))
        port = free_port()
        web = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind",
             f"127.0.0.1:{port}", "--workers", str(args.workers), "--log-level", "warning"],
            cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
        processes.append(web)
        host = f"http://127.0.0.1:{port}"
        _wait_http(host, web)
        result_path = work / "result.json"
        subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(BASE_DIR / "bench" / "load" / "locustfile.py"),
             "--headless", "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
             "--run-time", f"{args.seconds}s", "--host", host, "--only-summary",
             "--loglevel", "WARNING", "--stop-timeout", "10"],
            cwd=BASE_DIR, check=False, stdout=subprocess.DEVNULL, stderr=(work / "locust.log").open("w"),
            env={**env, "IBEX_LOAD_KEYS": json.dumps(keys), "IBEX_LOAD_RESULT": str(result_path)})
        if not result_path.exists():
            sys.exit(f"bench/load.py: locust wrote no result; see {work / 'locust.log'}")
        result = json.loads(result_path.read_text())
        shutil.rmtree(work, ignore_errors=True)  # kept (logs) only when the run failed
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        if own_database:
            from django.db import connections

            connections.close_all()
            with _admin_connection(server) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    result.update(users=args.users, gunicorn_workers=args.workers, python=platform.python_version(),
                  cpus=os.cpu_count(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    result["targets_met"] = result["errors"] == 0 and all(
        result["groups"][g]["p99_ms"] < limit for g, limit in TARGETS_MS.items())
    line = json.dumps(result)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""From order to active lease, at volume: 1,000 on-demand orders through the API (gunicorn),
placed by a real Celery worker, acknowledged by `ibex-agent simulate` heartbeats (every
`--interval` s; a heartbeat answer that starts a lease asks for the next one within 1 s), each
lease activated by its last acknowledgement (and by the beat's safety net every 5 s, run here).
Reports p50/p95 order → active.

    python bench/order_to_active_bench.py [--orders 1000] [--nodes 256] [--interval 15]

Without DATABASE_URL / REDIS_URL it runs on the embedded default. It builds its own
provider and 2,048-GPU fabric, named `bench-o2a-<time>`, and leaves them in place (they are
what its leases point at).
"""

import argparse
import os
import resource
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
EMBEDDED = not os.environ.get("DATABASE_URL")

import django  # noqa: E402

django.setup()

import psutil  # noqa: E402
import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from billing import services as money  # noqa: E402
from fabric import services as fabric_services  # noqa: E402
from fabric.core import generators  # noqa: E402
from ibex.accounts import services as accounts  # noqa: E402
from market import prices  # noqa: E402
from market.models import Lease, LeaseEvent  # noqa: E402
from pool import services as pool  # noqa: E402
from scheduler import placing as scheduler  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_of(child: subprocess.Popen) -> float:
    """CPU seconds of a child and its own children (gunicorn workers, Celery pool)."""
    process = psutil.Process(child.pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--orders", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--interval", type=int, default=15,
                        help="heartbeat interval (s); 15 is the production default")
    args = parser.parse_args()
    os.environ["NODE_HEARTBEAT_INTERVAL_S"] = str(args.interval)
    settings.NODE_HEARTBEAT_INTERVAL_S = args.interval  # the nodes registered here
    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    # An earlier run's nodes stay in the database with their agents gone; mark them silent, as
    # the beat would (else this run's orders are placed on nodes that never acknowledge).
    pool.mark_unreachable_nodes()
    stamp = int(time.time())
    provider = accounts.create_organization(slug=f"bench-o2a-{stamp}", roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="bench",
                                   reason="bench")
    spec = generators.fat_tree(args.nodes, 32, tiers=2, prefix=f"o2a{stamp}-")
    fabric_services.save_fabric(owner=provider, name=f"bench-o2a-{stamp}", spec=spec,
                                source="generator")
    pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
        hostname=h, fabric=f"bench-o2a-{stamp}", gpu_model="H100-80GB", gpu_count=8,
        cpu_cores=64, memory_gib=1024) for h in spec.hosts])
    prices.set_prices(provider=provider, scope={"fabric": f"bench-o2a-{stamp}"},
                      price_micros=2_000_000, actor="bench")
    tenant = accounts.create_organization(slug=f"bench-tenant-{stamp}", roles=("tenant",))
    money.grant_credit(organization=tenant, amount_micros=10**12, reason="bench", actor="bench")
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=["read", "trade"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the throttles guard a real API; one bench tenant sending 1,000 orders a minute is the load
    env = {**os.environ, "DEBUG": "1", "THROTTLE_USER": "1000000/min",
           "THROTTLE_ORDERS": "1000000/min"}
    children = [
        subprocess.Popen([sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind",
                          f"127.0.0.1:{port}", "--workers", "3", "--log-level", "warning"],
                         cwd=BASE_DIR, env=env),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "ibex", "worker", "--loglevel",
                          "warning", "--concurrency", "2", "--hostname", f"o2a-{stamp}@%h"],
                         cwd=BASE_DIR, env=env),
    ]
    try:
        for _ in range(300):
            try:
                requests.get(f"{url}/healthz", timeout=2)
                break
            except requests.RequestException:
                time.sleep(0.2)
        hosts = f"o2a{stamp}-[{spec.hosts[0].split('-')[-1]}-{spec.hosts[-1].split('-')[-1]}]"
        children.append(subprocess.Popen(
            [sys.executable, "-m", "agent", "simulate", "--api", url, "--key",
             provider_key.raw_key, "--fabric", f"bench-o2a-{stamp}", "--hosts", hosts,
             "--gpu-model", "H100-80GB", "--gpus", "8", "--workers", "16", "--quiet"],
            cwd=BASE_DIR, env=env))
        while pool.offered_gpus().filter(node__provider=provider).count() < args.nodes * 8:
            time.sleep(0.5)
        # Steady state: the nodes were analysed while `registering`; autovacuum re-analyses
        # them within a minute of their first heartbeats; do it now rather than wait.
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {tenant_key.raw_key}"

        def order(n):
            return session.post(f"{url}/api/v1/orders/", json={
                "gpu_models": ["H100-80GB"], "gpus": 1 + n % 2, "hours": 1,
                "tier": "on_demand", "max_price_per_gpu_hour": "3.00"}, timeout=60).json()

        started = time.perf_counter()
        started_at = timezone.now()
        with ThreadPoolExecutor(8) as threads:
            answers = list(threads.map(order, range(args.orders)))
        submitted = time.perf_counter() - started
        lease_ids = [a["lease"] for a in answers if a.get("lease")]
        deadline = time.monotonic() + 600
        last_beat = time.monotonic()
        while Lease.objects.filter(pk__in=lease_ids, state="active").count() < len(lease_ids):
            if time.monotonic() - last_beat >= 5:
                scheduler.activate_acknowledged_leases()  # beat's safety net, every 5 s
                last_beat = time.monotonic()
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        waits, last_active = [], None
        for lease in Lease.objects.filter(pk__in=lease_ids).select_related("order"):
            active = LeaseEvent.objects.filter(lease=lease, to_state="active").first()
            if active:
                waits.append((active.at - lease.order.created_at).total_seconds())
                last_active = max(last_active or active.at, active.at)
        total = (last_active - started_at).total_seconds() if last_active else float("nan")
        waits.sort()
        print(f"{len(lease_ids)} of {args.orders} orders filled ({args.nodes} nodes, heartbeat "
              f"every {args.interval} s, "
              f"{'embedded' if EMBEDDED else 'external'} services); submitted in "
              f"{submitted:.1f} s; all active after {total:.1f} s; order → active p50 "
              f"{statistics.median(waits):.1f} s, p95 {waits[int(len(waits) * 0.95) - 1]:.1f} s, "
              f"active {len(waits)}", flush=True)
        print("CPU by process (s): " + ", ".join(
            f"{name} {cpu_of(child):.0f}" for name, child in zip(
                ("web", "worker", "agents"), children, strict=False)), flush=True)
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(timeout=60)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"CPU used by the web server, worker and agents: {used.ru_utime + used.ru_stime:.0f} s "
          f"(PostgreSQL and Redis not counted); load average now "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()

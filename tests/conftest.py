"""Shared test fixtures: plain HTTP for the test client, API clients and a real Celery worker.

The tests run against PostgreSQL and Redis: the real services when DATABASE_URL/REDIS_URL
are set, IBEX's embedded ones otherwise (started by the settings, stopped at exit).
"""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection
from rest_framework.test import APIClient

from ibex.celery import app as celery_app
from scheduler.routing import worker_queues
from tests.clock import CLOCK_ENV, start_shifted_clock

BASE_DIR = Path(__file__).resolve().parent.parent
WORKER_START_TIMEOUT_S = 60


def pytest_addoption(parser):
    parser.addoption("--clock", default=os.environ.get(CLOCK_ENV, ""), metavar="INSTANT",
                     help=f"run the whole suite from this instant, e.g. 2027-12-31T23:57:00Z "
                          f"(or {CLOCK_ENV}; tests/clock.py)")


def pytest_configure(config):
    instant = config.getoption("--clock")
    if instant:
        config.stash[_CLOCK] = start_shifted_clock(instant)


def pytest_unconfigure(config):
    traveller = config.stash.get(_CLOCK, None)
    if traveller is not None:
        traveller.stop()


def pytest_report_header(config):
    instant = config.getoption("--clock")
    return f"clock: shifted, the run starts at {instant}" if instant else "clock: real"


_CLOCK = pytest.StashKey()


@pytest.fixture(autouse=True, scope="session")
def _plain_http():
    # Production settings redirect HTTP to HTTPS; the test client and the live server speak
    # plain HTTP. Session-wide and set before any server builds its middleware.
    from django.conf import settings

    settings.SECURE_SSL_REDIRECT = False


@pytest.fixture(autouse=True)
def _no_rate_limit_history():
    """Each test starts with no requests counted against it: the API's throttle counters live
    in Redis, shared by the whole run, and without this a test's anonymous sign-up was refused
    (429) whenever the tests before it, in the same minute, had spent the address's allowance.
    Nor with placement hints of leases of earlier tests (`ibex:lease-avoid:<id>`): the
    database starts lease ids again, Redis does not; nor with the mix of orders earlier tests
    placed (`ibex:parts-mix`), nor with earlier tests' providers' reliability
    (`ibex:provider-reliability`)."""
    from django.core.cache import cache

    try:
        client = cache._cache.get_client(write=True)
        stale = [key for pattern in ("throttle_*", "ibex:lease-avoid:*", "ibex:parts-mix*",
                                        "ibex:provider-reliability")
                 for key in client.scan_iter(match=cache.make_key(pattern))]
        if stale:
            client.delete(*stale)
    except Exception:  # noqa: BLE001 - no Redis: nothing was counted either
        pass


def database_url_for(settings_dict: dict) -> str:
    """The URL of the database the tests use, for processes the tests start."""
    user = quote(settings_dict["USER"] or "")
    password = f":{quote(settings_dict['PASSWORD'])}" if settings_dict["PASSWORD"] else ""
    host = settings_dict["HOST"] or ""
    port = settings_dict["PORT"] or ""
    name = settings_dict["NAME"]
    if host.startswith("/"):
        return f"postgresql://{user}{password}@/{name}?host={host}"
    return f"postgresql://{user}{password}@{host}{':' + port if port else ''}/{name}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url_for(connection.settings_dict)
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def celery_worker_session(django_db_setup, django_db_blocker):
    """A real `celery worker` process on a queue of its own (and that queue's placement
    partitions), against the test database; started once, used through `celery_worker_process`."""
    queue = f"test-{uuid.uuid4().hex[:8]}"
    with django_db_blocker.unblock():
        env = child_env(CELERY_QUEUE=queue)
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "ibex", "worker", "--pool", "solo",
         "--queues", ",".join(worker_queues(queue)), "--hostname", f"{queue}@%h",
         "--loglevel", "warning",
         "--without-mingle", "--without-gossip"],
        cwd=BASE_DIR, env=env,
    )
    deadline = time.monotonic() + WORKER_START_TIMEOUT_S
    while not celery_app.control.ping(destination=[_hostname(queue)], timeout=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the Celery worker did not start (status {process.poll()})")
    yield process, queue
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture
def celery_worker_process(celery_worker_session, request):
    """The session's worker, with this test's tasks routed to it. Only tests that ask for it
    send it work: another test's outbox message must not run in the worker while that test
    (or its teardown's flush) still holds the rows.

    The test's work can outlive its body: a task the test waited on records events whose
    `fan_out_events` it queues, to the worker's own queue, after its commit; a retry waits in
    the worker for its countdown. Such a task, still running when pytest-django's flush of a
    transactional test TRUNCATEs every table, takes its locks table by table while the TRUNCATE
    takes its own in another order: a deadlock that fails the test's teardown (or the task). So
    the teardown stops sending here, then empties the worker (`_quiesce`), before the flush."""
    # The database fixture's teardown (flush or rollback) must come after ours: set it up first
    # when the test asked for it by argument (a marker or `live_server` sets it up autouse,
    # hence before us, already).
    for name in ("transactional_db", "db"):
        if name in request.fixturenames:
            request.getfixturevalue(name)
    process, queue = celery_worker_session
    previous_queue = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = queue
    yield process
    celery_app.conf.task_default_queue = previous_queue
    if process.poll() is None:
        _quiesce(queue)


WORKER_QUIESCE_TIMEOUT_S = 60


def _quiesce(queue: str) -> None:
    """Return once nothing of this test's is queued for, held by or running in the worker.

    A barrier, not a wait: each round purges the worker's queues between two snapshots of the
    worker (its count of tasks started, and what it runs, holds or has scheduled) and revokes
    what it holds but has not started (a retry's countdown, a prefetched message). It is done
    when the purge found nothing, nothing ran at either snapshot and no task started between
    them: nothing was running that could queue more, the queues were empty in between, and the
    test itself no longer routes here, so nothing can start afterwards either. (The solo pool
    answers between tasks only; a task run by the ETA timer shows in `active`.)"""
    hostname = _hostname(queue)
    queues = worker_queues(queue)
    revoked: set[str] = set()
    deadline = time.monotonic() + WORKER_QUIESCE_TIMEOUT_S
    before = _worker_snapshot(hostname)
    while True:
        purged = _purge(queues)
        after = _worker_snapshot(hostname)
        if before is not None and after is not None:
            held = (after["held"] | before["held"]) - revoked
            if held:
                celery_app.control.revoke(sorted(held), destination=[hostname], reply=True,
                                          timeout=1.0)
                revoked |= held
            elif (not purged and not before["active"] and not after["active"]
                  and before["started"] == after["started"]):
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Celery worker {hostname} is still busy after "
                               f"{WORKER_QUIESCE_TIMEOUT_S} s: {after or 'no answer'}, "
                               f"{purged} message(s) purged in the last round")
        before = after


def _worker_snapshot(hostname: str) -> dict | None:
    """The worker's count of started tasks, the ids it runs and those it holds unstarted;
    None when it does not answer (the solo pool is busy with a task)."""
    inspect = celery_app.control.inspect(destination=[hostname], timeout=0.5, limit=1)
    stats = (inspect.stats() or {}).get(hostname)
    active = (inspect.active() or {}).get(hostname)
    reserved = (inspect.reserved() or {}).get(hostname)
    scheduled = (inspect.scheduled() or {}).get(hostname)
    if stats is None or active is None or reserved is None or scheduled is None:
        return None
    return {"started": sum(stats.get("total", {}).values()),
            "active": {task["id"] for task in active},
            "held": ({task["id"] for task in reserved}
                     | {entry["request"]["id"] for entry in scheduled})}


def _purge(queues: list[str]) -> int:
    """Drop the messages waiting in these queues; how many there were."""
    with celery_app.connection_for_write() as conn:
        channel = conn.default_channel
        return sum(channel.queue_purge(name) or 0 for name in queues)


def _hostname(queue: str) -> str:
    import socket

    return f"{queue}@{socket.gethostname()}"


@pytest.fixture
def api_client():
    return APIClient()


@pytest.fixture
def tenant_key(db):
    from ibex.accounts import services

    org = services.create_organization(slug="acme-ai", name="Acme AI", roles=("tenant",))
    return services.issue_api_key(organization=org, scopes=["read", "trade"])


@pytest.fixture
def tenant_client(tenant_key):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant_key.raw_key}")
    return client


# --- named personas (an app's conftest may refine them, e.g. a verified provider) ------------


@pytest.fixture
def provider(db):
    from tests.factories import make_org

    return make_org("hpc-provider", "provider")


@pytest.fixture
def rival_provider(db):
    from tests.factories import make_org

    return make_org("rival-cloud", "provider")


@pytest.fixture
def tenant(db):
    from tests.factories import make_org

    return make_org("acme-ai", "tenant")


@pytest.fixture
def operator(db):
    from tests.factories import make_org

    return make_org("ibex-ops", "operator")


@pytest.fixture
def provider_client(provider):
    from tests.factories import client_for

    return client_for(provider)


@pytest.fixture(autouse=True)
def _no_dns_for_webhooks(monkeypatch):
    """Tests send nothing off loopback, DNS queries included: webhook host names do not
    resolve here (an address written in the URL is checked as it is)."""
    from notify.core import webhook_targets

    def unresolvable(host, port):
        raise OSError(f"{host}: name resolution is off in the tests")

    monkeypatch.setattr(webhook_targets, "system_resolver", unresolvable)


@pytest.fixture
def loopback_webhooks(settings):
    """The operator's exception that lets webhooks reach a receiver on this machine."""
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOWED_NETWORKS = "127.0.0.1/32"

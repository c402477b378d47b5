"""Personas and helpers for money tests; after every test the ledger must sum to zero."""

import os
import threading

import pytest
from django.db import connection, connections

from billing import ledger
from billing.models import Account
from ibex.accounts.models import ProviderProfile
from ibex.celery import app as celery_app
from tests.factories import client_for, make_org
from tests.fakes.stripe_server import FakeStripeServer, signed_delivery

WEBHOOK_SECRET = "whsec_test_ibex"

# Tests that race real connections commit for real. Listing the apps they touch keeps the flush
# after them to those apps' tables, so seeded data (the GPU catalogue) survives for later tests.
racing = pytest.mark.django_db(transaction=True, available_apps=[
    "django.contrib.contenttypes", "django.contrib.auth", "ibex.accounts", "billing", "market"])


@pytest.fixture(autouse=True)
def ledger_balances_to_zero(request):
    """Every test that touches the database ends with a ledger whose entries sum to zero and
    whose cached balances equal the sums of their entries."""
    marker = request.node.get_closest_marker("django_db")
    transactional = bool(marker and marker.kwargs.get("transaction"))
    if not (marker or "db" in request.fixturenames or transactional):
        yield  # a pure test (money arithmetic, clearing): no database
        return
    if not transactional:
        request.getfixturevalue("db")  # set up first, so this check runs before the rollback
    yield
    assert ledger.total_of_all_accounts() == 0
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT a.id, a.balance_micros, coalesce(sum(e.amount_micros), 0)
              FROM market_account a LEFT JOIN market_entry e ON e.account_id = a.id
             GROUP BY a.id HAVING a.balance_micros <> coalesce(sum(e.amount_micros), 0)""")
        assert cursor.fetchall() == []


@pytest.fixture
def tenant(db):
    return make_org("acme-ai", "tenant")


@pytest.fixture
def rival_tenant(db):
    return make_org("rival-labs", "tenant")


@pytest.fixture
def provider(db):
    org = make_org("hpc-provider", "provider")
    ProviderProfile.objects.filter(organization=org).update(state="verified")
    return org


@pytest.fixture
def operator(db):
    return make_org("ibex-ops", "operator")


@pytest.fixture
def tenant_client(tenant):
    return client_for(tenant, scopes=("read", "trade", "admin"))


@pytest.fixture
def provider_client(provider):
    return client_for(provider, scopes=("read", "provide", "admin"))


# One fake Stripe for the whole run, started while conftests load, before any test starts a
# Celery worker process: the worker inherits these variables and calls the fake too.
STRIPE_SERVER = FakeStripeServer().start()
os.environ.update(STRIPE_API_BASE=STRIPE_SERVER.url, STRIPE_API_KEY="sk_test_ibex",
                  STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET)


@pytest.fixture(scope="session")
def stripe_server():
    return STRIPE_SERVER


@pytest.fixture
def fake_stripe(stripe_server, settings, db):
    """The fake Stripe, empty, with IBEX pointed at it; Celery tasks run eagerly."""
    stripe_server.fake.reset()
    settings.STRIPE_API_BASE = stripe_server.url
    settings.STRIPE_API_KEY = "sk_test_ibex"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield stripe_server.fake
    celery_app.conf.task_always_eager = eager


def deliver(client, event: dict, secret: str = WEBHOOK_SECRET):
    payload, signature = signed_delivery(event, secret)
    return client.post("/api/v1/stripe/webhook/", payload, content_type="application/json",
                       HTTP_STRIPE_SIGNATURE=signature)


def in_threads(count: int, work) -> list:
    """Run work(i) in `count` threads at once, each on its own connection; results or errors."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def run(i):
        try:
            barrier.wait()
            results[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - the test inspects what each thread met
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def balance(org, kind=Account.Kind.TENANT_AVAILABLE) -> int:
    return ledger.balance(org, kind)

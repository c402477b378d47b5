"""Moving models between apps moved no rows.

The money models left `market` for `billing` (billing 0001, market 0007, scheduler 0004 for the
SLA credit's ledger link) and the event and webhook models left `scheduler` for `notify`
(scheduler 0003, notify 0001). Those migrations change only Django's idea of which app owns a
table; the tables keep their names. Each test takes the database back to just before the moves,
writes rows through the models as they were then (`market.Hold`, `scheduler.Event`, ...),
migrates to the latest migrations of every app and reads the same rows through today's models.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from billing.models import (
    Account,
    Entry,
    Hold,
    LedgerTransaction,
    MoneyStateChange,
    Payout,
    Refund,
    TopUp,
)
from ibex.accounts.models import Organization
from market.models import Lease
from notify.models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from scheduler.models import SlaCredit

pytestmark = pytest.mark.django_db(transaction=True)

LAST_MIGRATIONS_BEFORE_THE_MOVES = [("market", "0006_order_priority_class"),
                                    ("scheduler", "0002_defrag_runs")]
APPS_BORN_IN_THE_MOVES = ["billing", "notify"]

AT = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
DOLLAR = 1_000_000  # micro-dollars


# --- the database before and after the moves -------------------------------------------------

def migrations_before_the_moves(graph) -> list[tuple[str, str]]:
    """Every app at its latest migration, except the apps the models left, at their last
    migration before the moves, and the apps born in the moves, not there at all."""
    latest = dict(graph.leaf_nodes())
    latest.update(LAST_MIGRATIONS_BEFORE_THE_MOVES)
    for app in APPS_BORN_IN_THE_MOVES:
        del latest[app]
    return sorted(latest.items())


def migrate_to_latest():
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.fixture
def old_apps():
    """The models as they were before the moves, on a database migrated back to then. Whatever
    the test does, the database ends at the latest migrations, as the tests after it expect."""
    executor = MigrationExecutor(connection)
    before = migrations_before_the_moves(executor.loader.graph)
    try:
        executor.migrate(before + [(app, None) for app in APPS_BORN_IN_THE_MOVES])
        yield executor.loader.project_state(before).apps
    finally:
        migrate_to_latest()


def stored(model, row) -> dict:
    """The row as the database holds it, read through `model` (a row's own historical model,
    or today's): every column, foreign keys as their `_id`s."""
    return model.objects.filter(pk=row.pk).values().get()


# --- rows written before the moves -----------------------------------------------------------

def organization(old_apps, slug, **roles):
    return old_apps.get_model("accounts", "Organization").objects.create(
        slug=slug, name=slug.title(), **roles)


def lease(old_apps, tenant):
    return old_apps.get_model("market", "Lease").objects.create(
        tenant=tenant, tier="on_demand", state="active", gpu_model="H100", gpu_count=8,
        price_micros=2 * DOLLAR, max_price_micros=3 * DOLLAR,
        starts_at=AT, ends_at=AT + timedelta(hours=4))


def ledger_transaction(old_apps, cause, source_type, source_id, lines):
    """A balanced transaction: `lines` are (account, amount_micros). The ledger's trigger checks
    the balance at commit, so the entries go in with their transaction, in one."""
    with transaction.atomic():
        txn = old_apps.get_model("market", "LedgerTransaction").objects.create(
            cause=cause, source_type=source_type, source_id=source_id, actor="system",
            memo=f"{cause} before the move")
        for account, amount_micros in lines:
            old_apps.get_model("market", "Entry").objects.create(
                transaction=txn, account=account, amount_micros=amount_micros)
    return txn


# --- the specification -----------------------------------------------------------------------

def test_money_written_in_market_is_billings_after_the_move_with_its_relations(old_apps):
    old = old_apps.get_model
    tenant = organization(old_apps, "acme", is_tenant=True)
    provider = organization(old_apps, "gpu-farm", is_provider=True)
    available = old("market", "Account").objects.create(
        organization=tenant, kind="tenant_available", balance_micros=55 * DOLLAR)
    clearing = old("market", "Account").objects.create(
        kind="stripe_clearing", balance_micros=-50 * DOLLAR)
    sla_pool = old("market", "Account").objects.create(
        kind="sla_credits", balance_micros=-5 * DOLLAR)
    top_up = old("market", "TopUp").objects.create(
        tenant=tenant, amount_micros=50 * DOLLAR, state="succeeded", refunded_micros=10 * DOLLAR,
        payment_intent_id="pi_before_the_move", idempotency_key="top-up-1")
    top_up_txn = ledger_transaction(old_apps, "top_up", "top_up", str(top_up.pk),
                                    [(available, 50 * DOLLAR), (clearing, -50 * DOLLAR)])
    state_change = old("market", "MoneyStateChange").objects.create(
        subject="top_up", subject_id=top_up.pk, from_state="created", to_state="succeeded",
        actor="stripe", reason="payment_intent.succeeded")
    refund = old("market", "Refund").objects.create(
        tenant=tenant, top_up=top_up, amount_micros=10 * DOLLAR, state="succeeded",
        stripe_refund_id="re_before_the_move", reason="unused balance")
    hold = old("market", "Hold").objects.create(
        tenant=tenant, order_ref="O-17", amount_micros=24 * DOLLAR,
        captured_micros=16 * DOLLAR, released_micros=8 * DOLLAR, state="closed",
        closed_at=AT + timedelta(hours=4))
    payout = old("market", "Payout").objects.create(
        provider=provider, amount_micros=20 * DOLLAR, state="paid",
        stripe_transfer_id="tr_before_the_move")
    credited_lease = lease(old_apps, tenant)
    credit_txn = ledger_transaction(old_apps, "sla_credit", "sla_credit", "L-1",
                                    [(available, 5 * DOLLAR), (sla_pool, -5 * DOLLAR)])
    credit = old("scheduler", "SlaCredit").objects.create(
        lease=credited_lease, window_start=AT, window_end=AT + timedelta(hours=1),
        down_gpu_seconds=3600, lease_gpu_seconds=28_800, owed_micros=5 * DOLLAR,
        amount_micros=5 * DOLLAR, reason="a GPU was down for an hour", transaction=credit_txn)
    written = [(Account, available), (Account, clearing), (Account, sla_pool),
               (TopUp, top_up), (LedgerTransaction, top_up_txn), (LedgerTransaction, credit_txn),
               *[(Entry, entry) for entry in old("market", "Entry").objects.all()],
               (Refund, refund), (MoneyStateChange, state_change), (Hold, hold),
               (Payout, payout), (SlaCredit, credit)]
    before = [stored(type(row), row) for _, row in written]

    migrate_to_latest()

    assert [stored(model, row) for model, row in written] == before
    assert sorted((e.account.kind, e.account.organization_id, e.amount_micros)
                  for e in LedgerTransaction.objects.get(pk=top_up_txn.pk).entries.all()) == [
        ("stripe_clearing", None, -50 * DOLLAR), ("tenant_available", tenant.pk, 50 * DOLLAR)]
    acme = Organization.objects.get(slug="acme")
    assert list(acme.top_ups.all()) == [TopUp.objects.get(pk=top_up.pk)]
    assert list(TopUp.objects.get(pk=top_up.pk).refunds.values_list(
        "tenant__slug", "amount_micros", "stripe_refund_id")) == [
        ("acme", 10 * DOLLAR, "re_before_the_move")]
    assert list(acme.holds.values_list("order_ref", "state", "closed_at")) == [
        ("O-17", "closed", AT + timedelta(hours=4))]
    assert Account.objects.get(organization=acme, kind="tenant_available").balance_micros == (
        55 * DOLLAR)
    assert list(Organization.objects.get(slug="gpu-farm").payouts.values_list(
        "amount_micros", "state", "stripe_transfer_id")) == [
        (20 * DOLLAR, "paid", "tr_before_the_move")]
    assert list(MoneyStateChange.objects.filter(subject="top_up", subject_id=top_up.pk)
                .values_list("from_state", "to_state", "reason")) == [
        ("created", "succeeded", "payment_intent.succeeded")]
    moved_credit = SlaCredit.objects.get(pk=credit.pk)
    assert moved_credit.transaction == LedgerTransaction.objects.get(pk=credit_txn.pk)
    assert moved_credit.transaction.sla_credit == moved_credit
    assert moved_credit.lease == Lease.objects.get(pk=credited_lease.pk)


def test_events_and_webhooks_written_in_scheduler_are_notifys_after_the_move(old_apps):
    old = old_apps.get_model
    tenant = organization(old_apps, "acme", is_tenant=True)
    started = lease(old_apps, tenant)
    event = old("scheduler", "Event").objects.create(
        tenant=tenant, lease=started, kind="lease.started", source="lease_event:41",
        payload={"lease": "L-1", "gpus": 8}, occurred_at=AT)
    endpoint = old("scheduler", "WebhookEndpoint").objects.create(
        tenant=tenant, url="https://acme.example/hooks", secret="whsec_before_the_move",
        description="ops pager")
    delivery = old("scheduler", "WebhookDelivery").objects.create(
        endpoint=endpoint, event=event, state="succeeded", attempts=2, status_code=200,
        next_attempt_at=AT + timedelta(minutes=1), delivered_at=AT + timedelta(minutes=1))
    failed_try = old("scheduler", "WebhookAttempt").objects.create(
        delivery=delivery, number=1, status_code=503, error="Service Unavailable",
        next_attempt_at=AT + timedelta(minutes=1), at=AT)
    answered_try = old("scheduler", "WebhookAttempt").objects.create(
        delivery=delivery, number=2, status_code=200, at=AT + timedelta(minutes=1))
    written = [(Event, event), (WebhookEndpoint, endpoint), (WebhookDelivery, delivery),
               (WebhookAttempt, failed_try), (WebhookAttempt, answered_try)]
    before = [stored(type(row), row) for _, row in written]

    migrate_to_latest()

    assert [stored(model, row) for model, row in written] == before
    acme = Organization.objects.get(slug="acme")
    moved_event = acme.events.get()
    assert (moved_event.kind, moved_event.source, moved_event.payload, moved_event.occurred_at) == (
        "lease.started", "lease_event:41", {"lease": "L-1", "gpus": 8}, AT)
    assert moved_event.lease == Lease.objects.get(pk=started.pk)
    moved_delivery = acme.webhook_endpoints.get(url="https://acme.example/hooks").deliveries.get()
    assert moved_delivery.event == moved_event
    assert (moved_delivery.state, moved_delivery.attempts, moved_delivery.delivered_at) == (
        "succeeded", 2, AT + timedelta(minutes=1))
    assert list(moved_delivery.attempt_log.values_list("number", "status_code", "error")) == [
        (1, 503, "Service Unavailable"), (2, 200, "")]


def test_permissions_granted_on_the_models_before_the_move_stay_granted_after_it(old_apps):
    content_types = old_apps.get_model("contenttypes", "ContentType").objects
    permissions = old_apps.get_model("auth", "Permission").objects
    view_holds = permissions.get(content_type=content_types.get(app_label="market", model="hold"),
                                 codename="view_hold")
    view_events = permissions.get(
        content_type=content_types.get(app_label="scheduler", model="event"),
        codename="view_event")
    support = old_apps.get_model("auth", "Group").objects.create(name="support")
    support.permissions.add(view_holds, view_events)

    migrate_to_latest()

    assert set(Group.objects.get(name="support").permissions.all()) == {
        Permission.objects.get(pk=view_holds.pk), Permission.objects.get(pk=view_events.pk)}
    assert Permission.objects.get(content_type=ContentType.objects.get_for_model(Hold),
                                  codename="view_hold").pk == view_holds.pk
    assert Permission.objects.get(content_type=ContentType.objects.get_for_model(Event),
                                  codename="view_event").pk == view_events.pk

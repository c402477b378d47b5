"""Every movement of money goes through here: grants, holds and spend limits, metered usage,
top-ups and refunds, Connect accounts and payouts, SLA credits, and Stripe webhook events.

One function per business action, each one transaction. Locks are taken in one order:
ledger accounts (ascending id, see `ledger.lock`) → hold / top-up / refund / payout row.
Stripe is never called from here: functions queue a task through the outbox (sent after commit).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.utils import timezone

from billing import ledger
from billing.core.money import divide_rounded, stripe_minor_units, to_dollars
from billing.ledger import InsufficientFunds, Line
from billing.models import (
    GPU_HOURS,
    Account,
    ConnectAccount,
    CreditGrant,
    Hold,
    LedgerTransaction,
    MoneyStateChange,
    Payout,
    Refund,
    SpendLimit,
    StripeEvent,
    TopUp,
    UsageRecord,
)
from ibex.accounts.models import Organization
from ibex.audit.services import record_audit
from ibex.errors import Refusal
from ibex.outbox import services as outbox
from ibex.references import lease_ref
from ibex.statemachine import StateMachine, transition

log = logging.getLogger(__name__)

Kind = Account.Kind
Cause = LedgerTransaction.Cause
CENT = 10_000  # micro-dollars


class MoneyError(Refusal):
    """A refused money action: `field` names the input at fault, `code` the kind of refusal."""


class TransitionError(MoneyError):
    code = "invalid_transition"


# Stripe is called by these tasks (billing/tasks.py), named here because tasks import services.
CREATE_PAYMENT_INTENT = "market.create_payment_intent"
SEND_REFUND = "market.send_refund"
CREATE_CONNECT_ACCOUNT = "market.create_connect_account"
SEND_PAYOUT = "market.send_payout"


def _queue(task_name: str, *args) -> None:
    """Hand a task to Celery through the outbox: recorded in this transaction, sent after
    commit, and sent later by the relay if Redis is down meanwhile."""
    outbox.enqueue(task_name, *args)


# --- state machines -----------------------------------------------------------------------------

T, R, P = TopUp.State, Refund.State, Payout.State
TOP_UP_TRANSITIONS = {
    T.CREATED: {T.SUCCEEDED, T.FAILED},
    T.FAILED: {T.SUCCEEDED},  # a declined card may be retried on the same PaymentIntent
    T.SUCCEEDED: {T.REFUNDED},
    T.REFUNDED: set(),
}
REFUND_TRANSITIONS = {R.PENDING: {R.SUCCEEDED, R.FAILED}, R.SUCCEEDED: set(), R.FAILED: set()}
PAYOUT_TRANSITIONS = {P.PENDING: {P.PAID, P.FAILED}, P.PAID: {P.FAILED}, P.FAILED: set()}


def _money_machine(subject: str, transitions: dict) -> StateMachine:
    return StateMachine(
        name=subject.replace("_", "-"), transitions=transitions, refusal=TransitionError,
        history=MoneyStateChange,
        history_of=lambda row: {"subject": subject, "subject_id": row.pk},
        audit=lambda row, change: {
            "action": f"money.{subject}.{change.to_state}", "target": f"{subject}:{row.pk}",
            "organization": getattr(row, "tenant", None) or getattr(row, "provider", None),
            "amount_micros": row.amount_micros, "details": {"reason": change.reason}})


MACHINES = {TopUp: _money_machine("top_up", TOP_UP_TRANSITIONS),
            Refund: _money_machine("refund", REFUND_TRANSITIONS),
            Payout: _money_machine("payout", PAYOUT_TRANSITIONS)}


def can_transition(row, to_state: str) -> bool:
    return MACHINES[type(row)].allows(row.state, to_state)


def change_money_state(row, *, to_state: str, actor: str, reason: str):
    """The one way a top-up, refund or payout changes state."""
    return transition(MACHINES[type(row)], row, to_state, actor=actor, reason=reason)


# --- balances and grants ------------------------------------------------------------------------


@dataclass(frozen=True)
class Balances:
    available_micros: int
    held_micros: int
    payable_micros: int
    held_back_micros: int


def balances_of(organization: Organization) -> Balances:
    found = dict(Account.objects.filter(organization=organization)
                 .values_list("kind", "balance_micros"))
    return Balances(available_micros=found.get(Kind.TENANT_AVAILABLE, 0),
                    held_micros=found.get(Kind.TENANT_HELD, 0),
                    payable_micros=found.get(Kind.PROVIDER_PAYABLE, 0),
                    held_back_micros=found.get(Kind.PROVIDER_HELD_BACK, 0))


@transaction.atomic
def grant_credit(*, organization: Organization, amount_micros: int, reason: str,
                 actor: str) -> CreditGrant:
    """Promotional or goodwill credit, paid by the platform's promotions account."""
    if amount_micros <= 0:
        raise MoneyError("grant a positive amount", field="amount")
    if not reason.strip():
        raise MoneyError("say why the credit is granted", field="reason")
    grant = CreditGrant.objects.create(organization=organization, amount_micros=amount_micros,
                                       reason=reason, actor=actor)
    ledger.move(from_account=ledger.account(None, Kind.PROMOTIONS),
                to_account=ledger.account(organization, Kind.TENANT_AVAILABLE),
                amount_micros=amount_micros, cause=Cause.GRANT, source_type="credit_grant",
                source_id=grant.pk, actor=actor, memo=reason)
    record_audit(action="money.credit_grant", target=f"credit_grant:{grant.pk}", actor=actor,
                 organization=organization, amount_micros=amount_micros,
                 details={"reason": reason[:500]})
    return grant


@transaction.atomic
def set_spend_limits(*, organization: Organization, per_hour_micros: int | None,
                     per_month_micros: int | None) -> SpendLimit:
    limit, _ = SpendLimit.objects.update_or_create(
        organization=organization,
        defaults={"per_hour_micros": per_hour_micros, "per_month_micros": per_month_micros})
    record_audit(action="money.spend_limits", target=f"spend_limit:{limit.pk}",
                 organization=organization, details={"per_hour_micros": per_hour_micros,
                                                     "per_month_micros": per_month_micros})
    return limit


# --- holds ----------------------------------------------------------------------------------------


def _committed_since(tenant: Organization, since: datetime) -> int:
    """What the tenant committed to orders since a moment: holds placed, less what came back."""
    total = (Hold.objects.filter(tenant=tenant, created_at__gte=since)
             .aggregate(total=Sum(F("amount_micros") - F("released_micros")))["total"])
    return total or 0


def _check_spend_limits(tenant: Organization, amount_micros: int, now: datetime) -> None:
    limit = SpendLimit.objects.filter(organization=tenant).first()
    if limit is None:
        return
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    for cap, since, period in ((limit.per_hour_micros, now - timedelta(hours=1), "hour"),
                               (limit.per_month_micros, month_start, "month")):
        if cap is None:
            continue
        committed = _committed_since(tenant, since)
        if committed + amount_micros > cap:
            raise MoneyError(
                f"this order would commit {to_dollars(committed + amount_micros)} USD this "
                f"{period}, over the spend limit of {to_dollars(cap)} USD",
                code="spend_limit_exceeded")


@transaction.atomic
def hold_for_order(*, tenant: Organization, order_ref: str, amount_micros: int,
                   actor: str = "system") -> Hold:
    """Hold an order's maximum cost from the tenant's available balance, or refuse it.

    Refuses (MoneyError code `insufficient_funds` or `spend_limit_exceeded`), holding nothing,
    when the balance or a spend limit would be overrun. Idempotent per order_ref.
    """
    if amount_micros <= 0:
        raise MoneyError("an order's maximum cost must be positive", field="amount")
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    held = ledger.account(tenant, Kind.TENANT_HELD)
    ledger.lock([available, held])  # serialises every hold of this tenant
    existing = Hold.objects.filter(order_ref=order_ref).first()
    if existing is not None:
        if existing.tenant_id != tenant.pk or existing.amount_micros != amount_micros:
            raise MoneyError(f"order {order_ref} already holds a different amount",
                             code="conflict")
        return existing
    _check_spend_limits(tenant, amount_micros, timezone.now())
    hold = Hold.objects.create(tenant=tenant, order_ref=order_ref, amount_micros=amount_micros)
    try:
        ledger.move(from_account=available, to_account=held, amount_micros=amount_micros,
                    cause=Cause.HOLD, source_type="hold", source_id=hold.pk, actor=actor,
                    memo=f"order {order_ref}")
    except InsufficientFunds as exc:
        raise MoneyError(f"insufficient funds: {exc}", code="insufficient_funds") from None
    return hold


def lock_tenant_balances(*, tenant: Organization) -> None:
    """Take the tenant's balance locks (available, then held): the first locks of any action
    that may hold money (STYLE.md: account → order → lease → node → GPUs)."""
    ledger.lock([ledger.account(tenant, Kind.TENANT_AVAILABLE),
                 ledger.account(tenant, Kind.TENANT_HELD)])


@transaction.atomic
def add_to_hold(*, tenant: Organization, order_ref: str, amount_micros: int,
                actor: str = "system", reason: str = "") -> Hold:
    """Hold more for an order whose commitment grew (its lease extended), or refuse it exactly
    as a new order is refused (`insufficient_funds`, `spend_limit_exceeded`), holding nothing."""
    if amount_micros <= 0:
        raise MoneyError("an extra hold must be positive", field="amount")
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    held = ledger.account(tenant, Kind.TENANT_HELD)
    ledger.lock([available, held])  # the same lock, in the same order, as every other hold
    hold = Hold.objects.select_for_update().filter(
        order_ref=order_ref, tenant=tenant, state=Hold.State.OPEN).first()
    if hold is None:
        raise MoneyError(f"order {order_ref} has no open hold to add to", code="invalid_state")
    _check_spend_limits(tenant, amount_micros, timezone.now())
    try:
        ledger.move(from_account=available, to_account=held, amount_micros=amount_micros,
                    cause=Cause.HOLD, source_type="hold", source_id=hold.pk, actor=actor,
                    memo=reason or f"order {order_ref}: more held")
    except InsufficientFunds as exc:
        raise MoneyError(f"insufficient funds: {exc}", code="insufficient_funds") from None
    Hold.objects.filter(pk=hold.pk).update(amount_micros=F("amount_micros") + amount_micros)
    hold.refresh_from_db()
    return hold


def _locked_hold(hold: Hold) -> Hold:
    return Hold.objects.select_for_update().get(pk=hold.pk)


@transaction.atomic
def release_hold(*, hold: Hold, actor: str = "system", reason: str = "order ended") -> Hold:
    """Give back what a hold did not capture and close it; calling it twice is harmless."""
    ledger.lock([ledger.account(hold.tenant, Kind.TENANT_AVAILABLE),
                 ledger.account(hold.tenant, Kind.TENANT_HELD)])
    hold = _locked_hold(hold)
    if hold.state == Hold.State.CLOSED:
        return hold
    remaining = hold.remaining_micros
    if remaining:
        ledger.move(from_account=ledger.account(hold.tenant, Kind.TENANT_HELD),
                    to_account=ledger.account(hold.tenant, Kind.TENANT_AVAILABLE),
                    amount_micros=remaining, cause=Cause.RELEASE, source_type="hold",
                    source_id=hold.pk, actor=actor, memo=reason)
    hold.released_micros += remaining
    hold.state = Hold.State.CLOSED
    hold.closed_at = timezone.now()
    hold.save(update_fields=["released_micros", "state", "closed_at"])
    return hold


@dataclass(frozen=True)
class Split:
    charge_micros: int
    fee_micros: int
    held_back_micros: int

    @property
    def payable_micros(self) -> int:
        return self.charge_micros - self.fee_micros - self.held_back_micros


def split_charge(charge_micros: int) -> Split:
    """Platform fee (commission) and provider hold-back, each rounded half to even."""
    fee = divide_rounded(charge_micros * settings.MARKET_COMMISSION_BP, 10_000)
    held_back = divide_rounded((charge_micros - fee) * settings.PROVIDER_HOLD_BACK_BP, 10_000)
    return Split(charge_micros, fee, held_back)


def _charge(*, tenant: Organization, payee: Organization, charge_micros: int,
            order_ref: str | None, cause: str, source_type: str, source_id: str,
            actor: str, memo: str) -> tuple[LedgerTransaction, Split]:
    """Charge the tenant (open hold first, then available) and credit the provider and fee."""
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    held = ledger.account(tenant, Kind.TENANT_HELD)
    payable = ledger.account(payee, Kind.PROVIDER_PAYABLE)
    held_back = ledger.account(payee, Kind.PROVIDER_HELD_BACK)
    revenue = ledger.account(None, Kind.PLATFORM_REVENUE)
    ledger.lock([available, held, payable, held_back, revenue])
    hold = Hold.objects.select_for_update().filter(order_ref=order_ref,
                                                   state=Hold.State.OPEN).first()
    from_hold = min(charge_micros, hold.remaining_micros) if hold else 0
    split = split_charge(charge_micros)
    try:
        tx = ledger.post(cause=cause, source_type=source_type, source_id=source_id, actor=actor,
                         memo=memo, lines=[
                             Line(held, -from_hold),
                             Line(available, -(charge_micros - from_hold)),
                             Line(payable, split.payable_micros),
                             Line(held_back, split.held_back_micros),
                             Line(revenue, split.fee_micros)])
    except InsufficientFunds as exc:
        raise MoneyError(f"insufficient funds: {exc}", code="insufficient_funds") from None
    if from_hold:
        Hold.objects.filter(pk=hold.pk).update(captured_micros=F("captured_micros") + from_hold)
    return tx, split


@transaction.atomic
def capture(*, hold: Hold, amount_micros: int, payee: Organization, reference: str,
            actor: str = "system") -> LedgerTransaction:
    """Capture part of a hold for a provider (beyond the hold: from available). Not idempotent
    by itself: `record_usage` is the idempotent way to bill running leases."""
    if amount_micros <= 0:
        raise MoneyError("capture a positive amount", field="amount")
    tx, _ = _charge(tenant=hold.tenant, payee=payee, charge_micros=amount_micros,
                    order_ref=hold.order_ref, cause=Cause.CAPTURE, source_type="hold",
                    source_id=str(hold.pk), actor=actor, memo=reference)
    return tx


# --- metered usage --------------------------------------------------------------------------------


def usage_charge_micros(*, price_per_gpu_hour_micros: int, gpus: int, seconds: int) -> int:
    return divide_rounded(price_per_gpu_hour_micros * gpus * seconds, 3600)


def usage_memo(lease_ref: str, payee: Organization, gpus: int, price_micros: int,
               minute: datetime) -> str:
    """"lease 4: 8 GPUs of campus-gpus at $1.29/GPU-hour, 2026-11-03 10:00 UTC" (a lease_ref is
    `L-<id>:<provider>:<price>`, one per provider and price of a lease)."""
    lease = lease_ref.split(":", 1)[0].removeprefix("L-")
    return (f"lease {lease}: {gpus} GPU{'s' if gpus != 1 else ''} of {payee.slug} at "
            f"${to_dollars(price_micros)}/GPU-hour, {minute:%Y-%m-%d %H:%M} UTC")


@transaction.atomic
def record_usage(*, lease_ref: str, payer: Organization, payee: Organization,
                 price_per_gpu_hour_micros: int, seconds: int, minute: datetime,
                 gpus: int = 1, order_ref: str | None = None) -> UsageRecord:
    """Bill one lease for the seconds it ran in one minute, exactly once.

    Idempotent per (lease_ref, minute) by a unique constraint: a second call, or a concurrent
    one, returns the first record and moves no money. The charge comes from the order's open
    hold first, then the available balance; the provider's share is split into payable and
    hold-back, the commission goes to platform revenue.
    """
    minute = minute.replace(second=0, microsecond=0)
    if not 0 <= seconds <= 60:
        raise MoneyError("a minute has 0 to 60 seconds", field="seconds")
    if price_per_gpu_hour_micros < 0 or gpus < 1:
        raise MoneyError("price and GPU count must be positive", field="price")
    existing = UsageRecord.objects.filter(lease_ref=lease_ref, minute=minute).first()
    if existing is not None:
        return existing
    charge = usage_charge_micros(price_per_gpu_hour_micros=price_per_gpu_hour_micros,
                                 gpus=gpus, seconds=seconds)
    try:
        with transaction.atomic():
            record = UsageRecord.objects.create(
                lease_ref=lease_ref, minute=minute, payer=payer, payee=payee, gpus=gpus,
                seconds=seconds, price_per_gpu_hour_micros=price_per_gpu_hour_micros,
                charge_micros=charge, fee_micros=0, held_back_micros=0)
    except IntegrityError:  # billed meanwhile by a concurrent run
        return UsageRecord.objects.get(lease_ref=lease_ref, minute=minute)
    if charge:
        tx, split = _charge(tenant=payer, payee=payee, charge_micros=charge, order_ref=order_ref,
                            cause=Cause.USAGE, source_type="usage", source_id=str(record.pk),
                            actor="metering", memo=usage_memo(lease_ref, payee, gpus,
                                                              price_per_gpu_hour_micros, minute))
        record.transaction, record.fee_micros = tx, split.fee_micros
        record.held_back_micros = split.held_back_micros
        record.save(update_fields=["transaction", "fee_micros", "held_back_micros"])
    return record


# --- private pools: GPU-hours, never money ---------------------------------------------------------

MICROS_PER_HOUR = 1_000_000


@transaction.atomic
def record_quota_usage(*, owner: Organization, tenant: Organization, lease_id: int,
                       queue_id: int, micro_gpu_hours: int) -> LedgerTransaction | None:
    """Account an ended pool lease's GPU-hours: the pool owner's `quota_issued` → the tenant's
    `quota_used`, in the currency `gph`, once per lease (called inside the lease's ending
    transaction)."""
    if micro_gpu_hours <= 0 or LedgerTransaction.objects.filter(
            cause=Cause.QUOTA_USAGE, source_type="lease", source_id=str(lease_id)).exists():
        return None
    issued = ledger.account(owner, Kind.QUOTA_ISSUED, GPU_HOURS)
    used = ledger.account(tenant, Kind.QUOTA_USED, GPU_HOURS)
    return ledger.move(from_account=issued, to_account=used, amount_micros=micro_gpu_hours,
                       cause=Cause.QUOTA_USAGE, source_type="lease", source_id=lease_id,
                       actor="metering", memo=f"lease {lease_id} in queue {queue_id}")


# --- SLA credits ----------------------------------------------------------------------------------


@transaction.atomic
def grant_sla_credit(*, tenant: Organization, provider: Organization, amount_micros: int,
                     lease_ref: str, reason: str, actor: str = "system") -> LedgerTransaction:
    """Credit a tenant for a broken SLA: from the provider's hold-back, the rest from the
    platform's SLA credits account."""
    if amount_micros <= 0:
        raise MoneyError("credit a positive amount", field="amount")
    held_back = ledger.account(provider, Kind.PROVIDER_HELD_BACK)
    platform = ledger.account(None, Kind.SLA_CREDITS)
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    locked = ledger.lock([held_back, platform, available])
    from_provider = min(amount_micros, locked[held_back.pk].balance_micros)
    record_audit(action="money.sla_credit", target=f"lease:{lease_ref}", actor=actor,
                 organization=tenant, amount_micros=amount_micros,
                 details={"provider": provider.slug, "from_provider_micros": from_provider,
                          "reason": reason[:500]})
    return ledger.post(cause=Cause.SLA_CREDIT, source_type="lease", source_id=lease_ref,
                       actor=actor, memo=reason, lines=[
                           Line(held_back, -from_provider),
                           Line(platform, -(amount_micros - from_provider)),
                           Line(available, amount_micros)])


# --- operator refunds of leases ----------------------------------------------------------------------

LEASE_REFUND = "lease_refund"


@transaction.atomic
def refund_lease_charges(*, tenant: Organization, lease_id: int, actor: str,
                         reason: str) -> int | None:
    """Give a tenant back everything it was charged for one lease: the amount refunded, or
    None when the lease was refunded before.

    The refund reverses the usage split: each provider gives back its payable share and
    hold-back (as far as its balances still hold them: a paid-out share is not clawed back),
    the platform its fee, and the platform's SLA credits account covers the rest. Refunding a
    lease twice refunds nothing more: the caller holds the lease's row lock."""
    if LedgerTransaction.objects.filter(source_type=LEASE_REFUND, source_id=str(lease_id)).exists():
        return None
    by_payee = (UsageRecord.objects.filter(lease_ref__startswith=f"{lease_ref(lease_id)}:")
                .values("payee").annotate(charge=Sum("charge_micros"), fee=Sum("fee_micros"),
                                          held_back=Sum("held_back_micros")).order_by("payee"))
    total = sum(row["charge"] for row in by_payee)
    if total <= 0:
        return 0
    payees = Organization.objects.in_bulk([row["payee"] for row in by_payee])
    revenue = ledger.account(None, Kind.PLATFORM_REVENUE)
    platform = ledger.account(None, Kind.SLA_CREDITS)
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    provider_accounts = [(row, ledger.account(payees[row["payee"]], Kind.PROVIDER_PAYABLE),
                          ledger.account(payees[row["payee"]], Kind.PROVIDER_HELD_BACK))
                         for row in by_payee]
    locked = ledger.lock([revenue, platform, available]
                         + [a for _, payable, held in provider_accounts for a in (payable, held)])
    lines = [Line(available, total)]
    covered = 0
    fees = 0
    for row, payable, held in provider_accounts:
        fees += row["fee"]
        share = row["charge"] - row["fee"] - row["held_back"]
        for acc, owed in ((payable, share), (held, row["held_back"])):
            back = min(owed, locked[acc.pk].balance_micros)
            if back > 0:
                lines.append(Line(acc, -back))
                covered += back
    fee_back = min(fees, locked[revenue.pk].balance_micros)
    if fee_back > 0:
        lines.append(Line(revenue, -fee_back))
        covered += fee_back
    if total - covered:
        lines.append(Line(platform, -(total - covered)))
    ledger.post(cause=Cause.GRANT, source_type=LEASE_REFUND, source_id=lease_id, actor=actor,
                memo=f"refund of lease {lease_id}: {reason}", lines=lines)
    return total


# --- top-ups --------------------------------------------------------------------------------------


def _whole_cents(amount_micros: int, field: str = "amount") -> None:
    if amount_micros % CENT:
        raise MoneyError("card payments move whole cents", field=field)


CARD_PAYMENTS_OFF = ("card payments are not configured on this exchange (no Stripe key); an "
                     "operator can grant credit instead")


def card_payments_configured() -> bool:
    """Whether top-ups by card can reach Stripe (STRIPE_API_KEY is set)."""
    return bool(settings.STRIPE_API_KEY)


@transaction.atomic
def create_top_up(*, tenant: Organization, amount_micros: int, idempotency_key: str | None = None,
                  automatic: bool = False, actor: str = "system") -> TopUp:
    """Start a card top-up; a task creates its PaymentIntent after commit."""
    if not tenant.is_tenant:
        raise MoneyError("only tenants top up", code="forbidden")
    if not card_payments_configured():
        raise MoneyError(CARD_PAYMENTS_OFF, code="card_payments_not_configured")
    _whole_cents(amount_micros)
    if not settings.TOP_UP_MIN_MICROS <= amount_micros <= settings.TOP_UP_MAX_MICROS:
        raise MoneyError(f"top up between {to_dollars(settings.TOP_UP_MIN_MICROS)} and "
                         f"{to_dollars(settings.TOP_UP_MAX_MICROS)} USD", field="amount")
    if idempotency_key:
        existing = TopUp.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    top_up = TopUp.objects.create(tenant=tenant, amount_micros=amount_micros,
                                  idempotency_key=idempotency_key, automatic=automatic)
    MoneyStateChange.objects.create(subject="top_up", subject_id=top_up.pk, from_state="",
                                    to_state=top_up.state, actor=actor, reason="requested")
    record_audit(action="money.top_up.requested", target=f"top_up:{top_up.pk}",
                 organization=tenant, amount_micros=amount_micros,
                 actor=None if actor == "system" and not automatic else actor)
    _queue(CREATE_PAYMENT_INTENT, top_up.pk)
    return top_up


@transaction.atomic
def record_payment_intent(*, top_up: TopUp, payment_intent_id: str, client_secret: str) -> TopUp:
    TopUp.objects.filter(pk=top_up.pk, payment_intent_id__isnull=True).update(
        payment_intent_id=payment_intent_id, client_secret=client_secret)
    return TopUp.objects.get(pk=top_up.pk)


def _locked_top_up(top_up_id: int) -> TopUp:
    top_up = TopUp.objects.select_related("tenant").get(pk=top_up_id)
    ledger.lock([ledger.account(None, Kind.STRIPE_CLEARING),
                 ledger.account(top_up.tenant, Kind.TENANT_AVAILABLE)])
    return TopUp.objects.select_for_update().select_related("tenant").get(pk=top_up_id)


@transaction.atomic
def top_up_succeeded(*, top_up_id: int, payment_intent_id: str, actor: str = "stripe") -> str:
    """Credit the tenant once, whatever order and how often Stripe tells us."""
    top_up = _locked_top_up(top_up_id)
    if not can_transition(top_up, T.SUCCEEDED):
        return f"top-up {top_up.pk} already {top_up.state}"
    change_money_state(top_up, to_state=T.SUCCEEDED, actor=actor, reason=f"{payment_intent_id} succeeded")
    ledger.move(from_account=ledger.account(None, Kind.STRIPE_CLEARING),
                to_account=ledger.account(top_up.tenant, Kind.TENANT_AVAILABLE),
                amount_micros=top_up.amount_micros, cause=Cause.TOP_UP, source_type="top_up",
                source_id=top_up.pk, actor=actor, memo=payment_intent_id)
    return f"top-up {top_up.pk} credited"


@transaction.atomic
def top_up_failed(*, top_up_id: int, error: str, actor: str = "stripe") -> str:
    top_up = _locked_top_up(top_up_id)
    top_up.last_error = error[:500]
    top_up.save(update_fields=["last_error"])
    if not can_transition(top_up, T.FAILED):
        return f"top-up {top_up.pk} already {top_up.state}"
    change_money_state(top_up, to_state=T.FAILED, actor=actor, reason=error)
    return f"top-up {top_up.pk} failed"


def tenants_to_top_up() -> list[Organization]:
    """Tenants with automatic top-up whose available balance fell under their threshold and
    that have no automatic top-up in flight."""
    limits = SpendLimit.objects.filter(auto_top_up_below_micros__isnull=False,
                                       auto_top_up_amount_micros__isnull=False,
                                       organization__is_tenant=True).select_related("organization")
    due = []
    for limit in limits:
        if balances_of(limit.organization).available_micros >= limit.auto_top_up_below_micros:
            continue
        if TopUp.objects.filter(tenant=limit.organization, automatic=True,
                                state=T.CREATED).exists():
            continue
        due.append(limit.organization)
    return due


def start_automatic_top_ups() -> list[TopUp]:
    started = []
    for tenant in tenants_to_top_up():
        limit = SpendLimit.objects.get(organization=tenant)
        started.append(create_top_up(tenant=tenant, amount_micros=limit.auto_top_up_amount_micros,
                                     automatic=True, actor="auto top-up"))
    return started


# --- refunds of unused balance -------------------------------------------------------------------


@transaction.atomic
def request_refund(*, tenant: Organization, amount_micros: int,
                   idempotency_key: str | None = None, top_up: TopUp | None = None,
                   actor: str = "system") -> Refund:
    """Return unused available balance to the card of one earlier top-up (the given one, else
    the newest that can take it).

    The money leaves the available balance at once (to Stripe clearing); a failed refund
    gives it back.
    """
    _whole_cents(amount_micros)
    if amount_micros <= 0:
        raise MoneyError("refund a positive amount", field="amount")
    if idempotency_key:
        existing = Refund.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return existing
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    clearing = ledger.account(None, Kind.STRIPE_CLEARING)
    ledger.lock([available, clearing])
    candidates = TopUp.objects.select_for_update().filter(
        tenant=tenant, state=T.SUCCEEDED, amount_micros__gte=F("refunded_micros") + amount_micros)
    if top_up is not None:
        candidates = candidates.filter(pk=top_up.pk)
    top_up = candidates.order_by("-id").first()
    if top_up is None:
        raise MoneyError("no single card top-up can take back this much", code="not_refundable",
                         field="amount")
    refund = Refund.objects.create(tenant=tenant, top_up=top_up, amount_micros=amount_micros,
                                   idempotency_key=idempotency_key)
    try:
        ledger.move(from_account=available, to_account=clearing, amount_micros=amount_micros,
                    cause=Cause.REFUND, source_type="refund", source_id=refund.pk, actor=actor)
    except InsufficientFunds as exc:
        raise MoneyError(f"insufficient funds: {exc}", code="insufficient_funds",
                         field="amount") from None
    top_up.refunded_micros += amount_micros
    top_up.save(update_fields=["refunded_micros"])
    MoneyStateChange.objects.create(subject="refund", subject_id=refund.pk, from_state="",
                                    to_state=refund.state, actor=actor, reason="requested")
    record_audit(action="money.refund.requested", target=f"refund:{refund.pk}",
                 actor=None if actor == "system" else actor, organization=tenant,
                 amount_micros=amount_micros, details={"top_up": top_up.pk})
    _queue(SEND_REFUND, refund.pk)
    return refund


def _locked_refund(refund_id: int) -> Refund:
    refund = Refund.objects.select_related("tenant").get(pk=refund_id)
    ledger.lock([ledger.account(None, Kind.STRIPE_CLEARING),
                 ledger.account(refund.tenant, Kind.TENANT_AVAILABLE)])
    return Refund.objects.select_for_update().select_related("tenant", "top_up").get(pk=refund_id)


@transaction.atomic
def refund_succeeded(*, refund_id: int, stripe_refund_id: str, actor: str = "stripe") -> str:
    refund = _locked_refund(refund_id)
    Refund.objects.filter(pk=refund.pk, stripe_refund_id__isnull=True).update(
        stripe_refund_id=stripe_refund_id)
    if not can_transition(refund, R.SUCCEEDED):
        return f"refund {refund.pk} already {refund.state}"
    change_money_state(refund, to_state=R.SUCCEEDED, actor=actor, reason=f"{stripe_refund_id} succeeded")
    top_up = TopUp.objects.select_for_update().get(pk=refund.top_up_id)
    refunded = (top_up.refunds.filter(state=R.SUCCEEDED)
                .aggregate(total=Sum("amount_micros"))["total"] or 0)
    if refunded == top_up.amount_micros and can_transition(top_up, T.REFUNDED):
        change_money_state(top_up, to_state=T.REFUNDED, actor=actor, reason="fully refunded")
    return f"refund {refund.pk} succeeded"


@transaction.atomic
def refund_failed(*, refund_id: int, error: str, actor: str = "stripe") -> str:
    """Give the money back to the available balance."""
    refund = _locked_refund(refund_id)
    if not can_transition(refund, R.FAILED):
        return f"refund {refund.pk} already {refund.state}"
    change_money_state(refund, to_state=R.FAILED, actor=actor, reason=error)
    ledger.move(from_account=ledger.account(None, Kind.STRIPE_CLEARING),
                to_account=ledger.account(refund.tenant, Kind.TENANT_AVAILABLE),
                amount_micros=refund.amount_micros, cause=Cause.REFUND_REVERSAL,
                source_type="refund", source_id=refund.pk, actor=actor, memo=error)
    TopUp.objects.filter(pk=refund.top_up_id).update(
        refunded_micros=F("refunded_micros") - refund.amount_micros)
    return f"refund {refund.pk} failed"


# --- Connect accounts and payouts ----------------------------------------------------------------


@transaction.atomic
def start_connect_onboarding(*, provider: Organization) -> ConnectAccount:
    """Create (once) the provider's Connect account; a task asks Stripe for it and a link."""
    if not provider.is_provider:
        raise MoneyError("only providers receive payouts", code="forbidden")
    connect, _ = ConnectAccount.objects.get_or_create(organization=provider)
    if not connect.details_submitted:
        _queue(CREATE_CONNECT_ACCOUNT, connect.pk)
    return connect


@transaction.atomic
def record_connect_account(*, connect: ConnectAccount, stripe_account_id: str,
                           onboarding_url: str) -> ConnectAccount:
    ConnectAccount.objects.filter(pk=connect.pk, stripe_account_id__isnull=True).update(
        stripe_account_id=stripe_account_id)
    ConnectAccount.objects.filter(pk=connect.pk).update(onboarding_url=onboarding_url)
    return ConnectAccount.objects.get(pk=connect.pk)


@transaction.atomic
def update_connect_status(*, stripe_account_id: str, details_submitted: bool,
                          charges_enabled: bool, payouts_enabled: bool) -> str:
    updated = ConnectAccount.objects.filter(stripe_account_id=stripe_account_id).update(
        details_submitted=details_submitted, charges_enabled=charges_enabled,
        payouts_enabled=payouts_enabled, updated_at=timezone.now())
    return f"account {stripe_account_id} {'updated' if updated else 'unknown'}"


@transaction.atomic
def create_payout(*, provider: Organization, actor: str = "system") -> Payout | None:
    """Pay out the payable balance in whole cents, if at least the minimum; else None.

    The hold-back stays in its own account, funding SLA credits.
    """
    connect = ConnectAccount.objects.filter(organization=provider, payouts_enabled=True).first()
    if connect is None or not connect.stripe_account_id:
        return None
    payable = ledger.account(provider, Kind.PROVIDER_PAYABLE)
    clearing = ledger.account(None, Kind.STRIPE_CLEARING)
    locked = ledger.lock([payable, clearing])
    amount = locked[payable.pk].balance_micros // CENT * CENT
    if amount < settings.PAYOUT_MINIMUM_MICROS:
        return None
    payout = Payout.objects.create(provider=provider, amount_micros=amount)
    MoneyStateChange.objects.create(subject="payout", subject_id=payout.pk, from_state="",
                                    to_state=payout.state, actor=actor, reason="scheduled")
    record_audit(action="money.payout.created", target=f"payout:{payout.pk}",
                 actor=None if actor == "system" else actor, organization=provider,
                 amount_micros=amount)
    ledger.move(from_account=payable, to_account=clearing, amount_micros=amount,
                cause=Cause.PAYOUT, source_type="payout", source_id=payout.pk, actor=actor)
    _queue(SEND_PAYOUT, payout.pk)
    return payout


def unsent_payouts(*, older_than_s: int, now: datetime | None = None) -> list[int]:
    """Pending payouts that never reached Stripe (their task was lost: a worker killed, a
    broker restarted) after this long; sending one again is safe (idempotency keys)."""
    cutoff = (now or timezone.now()) - timedelta(seconds=older_than_s)
    return list(Payout.objects.filter(state=P.PENDING, stripe_payout_id__isnull=True,
                                      created_at__lt=cutoff).order_by("pk")
                .values_list("pk", flat=True))


def schedule_payouts() -> list[Payout]:
    providers = Organization.objects.filter(connect_account__payouts_enabled=True)
    return [p for p in (create_payout(provider=org) for org in providers) if p is not None]


@transaction.atomic
def record_payout_ids(*, payout: Payout, transfer_id: str, payout_id: str) -> None:
    Payout.objects.filter(pk=payout.pk, stripe_transfer_id__isnull=True).update(
        stripe_transfer_id=transfer_id)
    Payout.objects.filter(pk=payout.pk, stripe_payout_id__isnull=True).update(
        stripe_payout_id=payout_id)


def _locked_payout(payout_id: int) -> Payout:
    payout = Payout.objects.select_related("provider").get(pk=payout_id)
    ledger.lock([ledger.account(payout.provider, Kind.PROVIDER_PAYABLE),
                 ledger.account(None, Kind.STRIPE_CLEARING)])
    return Payout.objects.select_for_update().select_related("provider").get(pk=payout_id)


@transaction.atomic
def payout_paid(*, payout_id: int, actor: str = "stripe") -> str:
    payout = _locked_payout(payout_id)
    if payout.state != P.PENDING:
        return f"payout {payout.pk} already {payout.state}"
    change_money_state(payout, to_state=P.PAID, actor=actor, reason="paid")
    return f"payout {payout.pk} paid"


@transaction.atomic
def payout_failed(*, payout_id: int, error: str, actor: str = "stripe") -> str:
    """A failed payout returns the money to the provider's payable balance."""
    payout = _locked_payout(payout_id)
    if not can_transition(payout, P.FAILED):
        return f"payout {payout.pk} already {payout.state}"
    change_money_state(payout, to_state=P.FAILED, actor=actor, reason=error)
    Payout.objects.filter(pk=payout.pk).update(last_error=error[:500])
    ledger.move(from_account=ledger.account(None, Kind.STRIPE_CLEARING),
                to_account=ledger.account(payout.provider, Kind.PROVIDER_PAYABLE),
                amount_micros=payout.amount_micros, cause=Cause.PAYOUT_REVERSAL,
                source_type="payout", source_id=payout.pk, actor=actor, memo=error)
    return f"payout {payout.pk} failed"


@dataclass(frozen=True)
class PayoutRerun:
    """What re-running a payout did: `resent` the same payout (pending: the send task again,
    Stripe's idempotency key keeps it one transfer), or made `new_payout` from the payable
    balance a failed one gave back, or `nothing` with why."""

    payout: Payout
    action: str  # "resent", "new_payout", "nothing"
    new_payout: Payout | None
    detail: str


@transaction.atomic
def rerun_payout(*, payout: Payout, actor: str) -> PayoutRerun:
    """An operator re-runs a payout. Idempotent: a pending payout is sent again under its own
    Stripe idempotency key; a failed one (its money back in payable) becomes a new payout of
    the payable balance, and a second re-run finds that balance already moved."""
    payout = _locked_payout(payout.pk)
    if payout.state == P.PENDING:
        _queue(SEND_PAYOUT, payout.pk)
        MoneyStateChange.objects.create(subject="payout", subject_id=payout.pk,
                                        from_state=payout.state, to_state=payout.state,
                                        actor=actor[:150], reason="re-sent by an operator")
        return PayoutRerun(payout, "resent", None, f"payout {payout.pk} sent again")
    if payout.state == P.PAID:
        return PayoutRerun(payout, "nothing", None, f"payout {payout.pk} is already paid")
    fresh = create_payout(provider=payout.provider, actor=actor)
    if fresh is None:
        return PayoutRerun(payout, "nothing", None,
                           f"payout {payout.pk} failed; nothing payable to send again "
                           "(under the minimum, already re-sent, or payouts not enabled)")
    return PayoutRerun(payout, "new_payout", fresh,
                       f"payout {payout.pk} failed; payout {fresh.pk} sends "
                       f"{to_dollars(fresh.amount_micros)} USD")


# --- Stripe webhook events ------------------------------------------------------------------------


def _ibex_id(obj: dict, key: str) -> int | None:
    value = (obj.get("metadata") or {}).get(key)
    return int(value) if value and str(value).isdigit() else None


def _on_payment_succeeded(obj: dict) -> str:
    top_up_id = _ibex_id(obj, "ibex_top_up")
    top_up = TopUp.objects.filter(pk=top_up_id).first() if top_up_id else None
    if top_up is None:
        return "not an IBEX top-up"
    received = obj.get("amount_received")
    if received != stripe_minor_units(top_up.amount_micros) or obj.get("currency") != top_up.currency:
        log.error("top-up %s: Stripe received %s %s, we asked for %s", top_up.pk, received,
                  obj.get("currency"), to_dollars(top_up.amount_micros))
        return f"top-up {top_up.pk}: amount received does not match; left for an operator"
    return top_up_succeeded(top_up_id=top_up_id, payment_intent_id=obj["id"])


def _on_payment_failed(obj: dict) -> str:
    top_up_id = _ibex_id(obj, "ibex_top_up")
    if top_up_id is None or not TopUp.objects.filter(pk=top_up_id).exists():
        return "not an IBEX top-up"
    error = (obj.get("last_payment_error") or {}).get("message") or "payment failed"
    return top_up_failed(top_up_id=top_up_id, error=error)


def _on_charge_refunded(obj: dict) -> str:
    outcomes = []
    for stripe_refund in (obj.get("refunds") or {}).get("data", []):
        refund_id = _ibex_id(stripe_refund, "ibex_refund")
        if refund_id is None or not Refund.objects.filter(pk=refund_id).exists():
            outcomes.append(f"{stripe_refund.get('id')}: not an IBEX refund")
        elif stripe_refund.get("status") == "succeeded":
            outcomes.append(refund_succeeded(refund_id=refund_id,
                                             stripe_refund_id=stripe_refund["id"]))
        elif stripe_refund.get("status") in ("failed", "canceled"):
            outcomes.append(refund_failed(refund_id=refund_id,
                                          error=stripe_refund.get("failure_reason") or "failed"))
    return "; ".join(outcomes) or "no refunds"


def _on_payout_paid(obj: dict) -> str:
    payout_id = _ibex_id(obj, "ibex_payout")
    if payout_id is None or not Payout.objects.filter(pk=payout_id).exists():
        return "not an IBEX payout"
    return payout_paid(payout_id=payout_id)


def _on_payout_failed(obj: dict) -> str:
    payout_id = _ibex_id(obj, "ibex_payout")
    if payout_id is None or not Payout.objects.filter(pk=payout_id).exists():
        return "not an IBEX payout"
    return payout_failed(payout_id=payout_id, error=obj.get("failure_message") or "failed")


def _on_account_updated(obj: dict) -> str:
    return update_connect_status(stripe_account_id=obj["id"],
                                 details_submitted=bool(obj.get("details_submitted")),
                                 charges_enabled=bool(obj.get("charges_enabled")),
                                 payouts_enabled=bool(obj.get("payouts_enabled")))


WEBHOOK_HANDLERS = {
    "payment_intent.succeeded": _on_payment_succeeded,
    "payment_intent.payment_failed": _on_payment_failed,
    "charge.refunded": _on_charge_refunded,
    "payout.paid": _on_payout_paid,
    "payout.failed": _on_payout_failed,
    "account.updated": _on_account_updated,
}


@dataclass(frozen=True)
class EventOutcome:
    duplicate: bool
    outcome: str


@transaction.atomic
def receive_stripe_event(*, event: dict) -> EventOutcome:
    """Store a verified event under its unique id and handle it, once.

    A duplicate delivery (even a concurrent one: it waits on the unique index) does nothing.
    """
    try:
        with transaction.atomic():
            stored = StripeEvent.objects.create(event_id=event["id"], type=event["type"],
                                                payload=event)
    except IntegrityError:
        return EventOutcome(duplicate=True, outcome="already received")
    handler = WEBHOOK_HANDLERS.get(event["type"])
    outcome = handler(event["data"]["object"]) if handler else "ignored"
    StripeEvent.objects.filter(pk=stored.pk).update(outcome=outcome[:500])
    return EventOutcome(duplicate=False, outcome=outcome)

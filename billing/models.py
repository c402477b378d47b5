"""The money: ledger accounts, transactions and entries, holds, credit grants, spend limits,
usage records, Stripe top-ups, refunds, Connect accounts, payouts and received Stripe events.

Ledger rows are written only by `billing/ledger.py`; amounts are integer micro-dollars. These
models were born in the `market` app and kept their tables (`market_*`) when they moved here.
"""

from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Mod
from django.db.models.lookups import Exact

from ibex.accounts.models import Organization
from ibex.statemachine import StateChange

USD = "usd"
GPU_HOURS = "gph"  # private pools: micro-GPU-hours, never money (see market/pool_orders.py)


class Account(models.Model):
    """One ledger account. Positive balance = what IBEX holds for the account's owner;
    the platform's funding accounts (Stripe clearing, promotions, SLA credits) run negative."""

    class Kind(models.TextChoices):
        TENANT_AVAILABLE = "tenant_available"
        TENANT_HELD = "tenant_held"
        PROVIDER_PAYABLE = "provider_payable"
        PROVIDER_HELD_BACK = "provider_held_back"
        PLATFORM_REVENUE = "platform_revenue"
        SLA_CREDITS = "sla_credits"
        PROMOTIONS = "promotions"
        STRIPE_CLEARING = "stripe_clearing"
        QUOTA_USED = "quota_used"  # GPU-hours an organisation used in private pools
        QUOTA_ISSUED = "quota_issued"  # GPU-hours a pool owner's pools gave out (negative)

    PLATFORM_KINDS = (Kind.PLATFORM_REVENUE, Kind.SLA_CREDITS, Kind.PROMOTIONS,
                      Kind.STRIPE_CLEARING)
    MAY_GO_NEGATIVE = (Kind.SLA_CREDITS, Kind.PROMOTIONS, Kind.STRIPE_CLEARING,
                       Kind.QUOTA_ISSUED)

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT, null=True,
                                     blank=True, related_name="ledger_accounts",
                                     help_text="empty for the platform's own accounts")
    kind = models.CharField(max_length=24, choices=Kind.choices)
    currency = models.CharField(max_length=3, default=USD)
    balance_micros = models.BigIntegerField(default=0,
                                            help_text="cache of the sum of entries, under lock")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_account"  # moved from market: the table kept its name
        constraints = [
            models.UniqueConstraint(fields=["organization", "kind", "currency"],
                                    nulls_distinct=False, name="one_account_per_org_kind"),
            models.CheckConstraint(
                condition=Q(balance_micros__gte=0) | Q(kind__in=[
                    "sla_credits", "promotions", "stripe_clearing", "quota_issued"]),
                name="account_balance_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(organization__isnull=True, kind__in=[
                    "platform_revenue", "sla_credits", "promotions", "stripe_clearing"])
                | Q(organization__isnull=False, kind__in=[
                    "tenant_available", "tenant_held", "provider_payable",
                    "provider_held_back", "quota_used", "quota_issued"]),
                name="account_owner_matches_kind",
            ),
        ]

    def __str__(self):
        return f"{self.organization or 'platform'}:{self.kind}"


class LedgerTransaction(models.Model):
    """A group of entries that sums to zero (enforced by a deferred trigger at commit)."""

    class Cause(models.TextChoices):
        TOP_UP = "top_up"
        GRANT = "grant"
        HOLD = "hold"
        RELEASE = "release"
        CAPTURE = "capture"
        USAGE = "usage"
        PAYOUT = "payout"
        PAYOUT_REVERSAL = "payout_reversal"
        REFUND = "refund"
        REFUND_REVERSAL = "refund_reversal"
        SLA_CREDIT = "sla_credit"
        QUOTA_USAGE = "quota_usage"

    cause = models.CharField(max_length=20, choices=Cause.choices)
    source_type = models.CharField(max_length=40, help_text="the kind of row that caused it")
    source_id = models.CharField(max_length=200, help_text="that row's id or reference")
    currency = models.CharField(max_length=3, default=USD)
    memo = models.CharField(max_length=500, blank=True)
    actor = models.CharField(max_length=150, help_text="a user name, or 'system'")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_ledgertransaction"  # moved from market: the table kept its name
        indexes = [models.Index(fields=["source_type", "source_id"])]

    def __str__(self):
        return f"#{self.pk} {self.cause} {self.source_type}:{self.source_id}"


class Entry(models.Model):
    """One line of a transaction: append-only (a trigger refuses UPDATE and DELETE)."""

    transaction = models.ForeignKey(LedgerTransaction, on_delete=models.PROTECT,
                                    related_name="entries")
    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="entries")
    amount_micros = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_entry"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=~Q(amount_micros=0), name="entry_not_zero"),
        ]
        indexes = [models.Index(fields=["account", "-id"])]

    def __str__(self):
        return f"{self.account} {self.amount_micros:+d}"


class CreditGrant(models.Model):
    """Promotional or goodwill credit given by an operator."""

    organization = models.ForeignKey(Organization, on_delete=models.PROTECT,
                                     related_name="credit_grants")
    amount_micros = models.BigIntegerField()
    reason = models.CharField(max_length=500)
    actor = models.CharField(max_length=150)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_creditgrant"  # moved from market: the table kept its name
        constraints = [models.CheckConstraint(condition=Q(amount_micros__gt=0),
                                              name="grant_positive")]

    def __str__(self):
        return f"grant {self.pk} to {self.organization_id}"


class SpendLimit(models.Model):
    """Caps on what an organisation may commit to orders; empty means no cap."""

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE,
                                        related_name="spend_limit")
    per_hour_micros = models.BigIntegerField(null=True, blank=True)
    per_month_micros = models.BigIntegerField(null=True, blank=True)
    auto_top_up_below_micros = models.BigIntegerField(
        null=True, blank=True, help_text="top up automatically when available falls below")
    auto_top_up_amount_micros = models.BigIntegerField(null=True, blank=True)
    stripe_customer_id = models.CharField(max_length=64, blank=True)
    stripe_payment_method_id = models.CharField(max_length=64, blank=True)

    class Meta:
        db_table = "market_spendlimit"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=Q(per_hour_micros__gte=0) | Q(per_hour_micros=None),
                                   name="hour_limit_not_negative"),
            models.CheckConstraint(condition=Q(per_month_micros__gte=0)
                                   | Q(per_month_micros=None), name="month_limit_not_negative"),
        ]

    def __str__(self):
        return f"limits of {self.organization_id}"


class Hold(models.Model):
    """An order's maximum cost, moved from the tenant's available to held balance."""

    class State(models.TextChoices):
        OPEN = "open"
        CLOSED = "closed"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="holds")
    order_ref = models.CharField(max_length=100, unique=True)
    amount_micros = models.BigIntegerField()
    captured_micros = models.BigIntegerField(default=0)
    released_micros = models.BigIntegerField(default=0)
    state = models.CharField(max_length=8, choices=State.choices, default=State.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "market_hold"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="hold_positive"),
            models.CheckConstraint(
                condition=Q(captured_micros__gte=0, released_micros__gte=0,
                            amount_micros__gte=F("captured_micros") + F("released_micros")),
                name="hold_not_overspent",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "created_at"])]

    def __str__(self):
        return f"hold {self.order_ref} ({self.state})"

    @property
    def remaining_micros(self) -> int:
        return self.amount_micros - self.captured_micros - self.released_micros


class UsageRecord(models.Model):
    """One lease's usage in one minute; unique per (lease, minute) so metering is idempotent."""

    lease_ref = models.CharField(max_length=100)
    minute = models.DateTimeField(help_text="start of the minute, UTC")
    payer = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="usage_paid")
    payee = models.ForeignKey(Organization, on_delete=models.PROTECT,
                              related_name="usage_earned")
    gpus = models.PositiveIntegerField()
    seconds = models.PositiveIntegerField()
    price_per_gpu_hour_micros = models.BigIntegerField()
    charge_micros = models.BigIntegerField()
    fee_micros = models.BigIntegerField()
    held_back_micros = models.BigIntegerField()
    transaction = models.OneToOneField(LedgerTransaction, on_delete=models.PROTECT, null=True,
                                       blank=True, related_name="usage_record")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_usagerecord"  # moved from market: the table kept its name
        constraints = [
            models.UniqueConstraint(fields=["lease_ref", "minute"], name="usage_once_per_minute"),
            models.CheckConstraint(condition=Q(seconds__lte=60), name="usage_within_minute"),
        ]
        indexes = [models.Index(fields=["payer", "minute"]),
                   models.Index(fields=["payee", "minute"])]

    def __str__(self):
        return f"{self.lease_ref} {self.minute:%Y-%m-%d %H:%M}"


class StripeMoney(models.Model):
    """Money moved through Stripe in one row: its amount, when it was asked for and last changed
    state, the last error Stripe gave, and the idempotency key every Stripe call for it sends."""

    stripe_kind = ""  # names the row in its idempotency key: "top-up", "payout"

    amount_micros = models.BigIntegerField()
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-{self.stripe_kind}-{self.pk}"


class TopUp(StripeMoney):
    """Money a tenant adds by card, through a Stripe PaymentIntent."""

    stripe_kind = "top-up"

    class State(models.TextChoices):
        CREATED = "created"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        REFUNDED = "refunded"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="top_ups")
    currency = models.CharField(max_length=3, default=USD)
    state = models.CharField(max_length=10, choices=State.choices, default=State.CREATED)
    automatic = models.BooleanField(default=False)
    idempotency_key = models.CharField(  # noqa: DJ001 - NULL: no key, never a duplicate
        max_length=100, null=True, blank=True, help_text="the client's Idempotency-Key header")
    payment_intent_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    client_secret = models.CharField(max_length=200, blank=True)
    refunded_micros = models.BigIntegerField(default=0)

    class Meta:
        db_table = "market_topup"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="top_up_positive"),
            models.CheckConstraint(condition=Exact(Mod("amount_micros", Value(10_000)), 0),
                                   name="top_up_whole_cents"),
            models.CheckConstraint(condition=Q(refunded_micros__gte=0,
                                               refunded_micros__lte=F("amount_micros")),
                                   name="top_up_refund_within_amount"),
            models.UniqueConstraint(fields=["tenant", "idempotency_key"],
                                    name="top_up_idempotency_key"),
        ]

    def __str__(self):
        return f"top-up {self.pk} ({self.state})"


class Refund(models.Model):
    """Unused balance returned to a tenant's card, against one succeeded top-up."""

    class State(models.TextChoices):
        PENDING = "pending"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="refunds")
    top_up = models.ForeignKey(TopUp, on_delete=models.PROTECT, related_name="refunds")
    idempotency_key = models.CharField(max_length=100, null=True, blank=True)  # noqa: DJ001
    amount_micros = models.BigIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    stripe_refund_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    reason = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_refund"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="refund_positive"),
            models.UniqueConstraint(fields=["tenant", "idempotency_key"],
                                    name="refund_idempotency_key"),
        ]

    def __str__(self):
        return f"refund {self.pk} ({self.state})"

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-refund-{self.pk}"


class ConnectAccount(models.Model):
    """A provider's Stripe Connect (Express) account, where payouts go."""

    organization = models.OneToOneField(Organization, on_delete=models.PROTECT,
                                        related_name="connect_account")
    stripe_account_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    onboarding_url = models.URLField(max_length=500, blank=True)
    details_submitted = models.BooleanField(default=False)
    charges_enabled = models.BooleanField(default=False)
    payouts_enabled = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "market_connectaccount"  # moved from market: the table kept its name

    def __str__(self):
        return f"{self.stripe_account_id or '(pending)'} ({self.organization_id})"

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-connect-{self.pk}"


class Payout(StripeMoney):
    """A provider's payable balance sent to their Connect account."""

    stripe_kind = "payout"

    class State(models.TextChoices):
        PENDING = "pending"
        PAID = "paid"
        FAILED = "failed"

    provider = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="payouts")
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    stripe_transfer_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    stripe_payout_id = models.CharField(max_length=64, null=True, blank=True, unique=True)

    class Meta:
        db_table = "market_payout"  # moved from market: the table kept its name
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="payout_positive"),
            models.CheckConstraint(condition=Exact(Mod("amount_micros", Value(10_000)), 0),
                                   name="payout_whole_cents"),  # Stripe moves whole cents
        ]

    def __str__(self):
        return f"payout {self.pk} ({self.state})"


class MoneyStateChange(StateChange):
    """History of top-up, refund and payout transitions: who, when, why."""

    subject = models.CharField(max_length=10, help_text="top_up, refund or payout")
    subject_id = models.BigIntegerField()

    class Meta(StateChange.Meta):
        db_table = "market_moneystatechange"  # moved from market: the table kept its name
        indexes = [models.Index(fields=["subject", "subject_id"])]

    def __str__(self):
        return f"{self.subject} {self.subject_id}: {self.from_state} → {self.to_state}"


class StripeEvent(models.Model):
    """A webhook event received from Stripe, stored once under its event id."""

    event_id = models.CharField(max_length=100, unique=True)
    type = models.CharField(max_length=100)
    payload = models.JSONField()
    outcome = models.CharField(max_length=500, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "market_stripeevent"  # moved from market: the table kept its name

    def __str__(self):
        return f"{self.event_id} {self.type}"

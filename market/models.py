"""Asks and prices, orders, auctions, leases and the ledger.

The money half lives here: ledger accounts, transactions and entries (written only by
`market/ledger.py`), holds, spend limits, usage records, Stripe top-ups, refunds, Connect
accounts, payouts and received webhook events. Amounts are integer micro-dollars.
"""

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Mod
from django.db.models.lookups import Exact

from ibex.accounts.models import Organization
from ibex.references import lease_ref

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
        constraints = [
            models.UniqueConstraint(fields=["lease_ref", "minute"], name="usage_once_per_minute"),
            models.CheckConstraint(condition=Q(seconds__lte=60), name="usage_within_minute"),
        ]
        indexes = [models.Index(fields=["payer", "minute"]),
                   models.Index(fields=["payee", "minute"])]

    def __str__(self):
        return f"{self.lease_ref} {self.minute:%Y-%m-%d %H:%M}"


class TopUp(models.Model):
    """Money a tenant adds by card, through a Stripe PaymentIntent."""

    class State(models.TextChoices):
        CREATED = "created"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        REFUNDED = "refunded"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="top_ups")
    amount_micros = models.BigIntegerField()
    currency = models.CharField(max_length=3, default=USD)
    state = models.CharField(max_length=10, choices=State.choices, default=State.CREATED)
    automatic = models.BooleanField(default=False)
    idempotency_key = models.CharField(  # noqa: DJ001 - NULL: no key, never a duplicate
        max_length=100, null=True, blank=True, help_text="the client's Idempotency-Key header")
    payment_intent_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    client_secret = models.CharField(max_length=200, blank=True)
    refunded_micros = models.BigIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
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

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-top-up-{self.pk}"


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

    def __str__(self):
        return f"{self.stripe_account_id or '(pending)'} ({self.organization_id})"

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-connect-{self.pk}"


class Payout(models.Model):
    """A provider's payable balance sent to their Connect account."""

    class State(models.TextChoices):
        PENDING = "pending"
        PAID = "paid"
        FAILED = "failed"

    provider = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="payouts")
    amount_micros = models.BigIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    stripe_transfer_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    stripe_payout_id = models.CharField(max_length=64, null=True, blank=True, unique=True)
    last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount_micros__gt=0), name="payout_positive"),
            models.CheckConstraint(condition=Exact(Mod("amount_micros", Value(10_000)), 0),
                                   name="payout_whole_cents"),  # Stripe moves whole cents
        ]

    def __str__(self):
        return f"payout {self.pk} ({self.state})"

    @property
    def stripe_idempotency_key(self) -> str:
        return f"ibex-payout-{self.pk}"


class MoneyStateChange(models.Model):
    """History of top-up, refund and payout transitions: who, when, why."""

    subject = models.CharField(max_length=10, help_text="top_up, refund or payout")
    subject_id = models.BigIntegerField()
    from_state = models.CharField(max_length=10)
    to_state = models.CharField(max_length=10)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]
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

    def __str__(self):
        return f"{self.event_id} {self.type}"


# --- prices ---------------------------------------------------------------------------------


class GpuPrice(models.Model):
    """A provider's hourly price for one GPU, from one change: never updated, only superseded,
    so the history of every GPU's price is kept (a lease keeps the price it was sold at).

    The price is also the GPU's reserve price in auctions: it is never sold below it.
    """

    gpu = models.ForeignKey("pool.Gpu", on_delete=models.CASCADE, related_name="prices")
    price_micros = models.BigIntegerField(help_text="micro-dollars per GPU-hour")
    offered_from = models.DateTimeField(null=True, blank=True)
    offered_until = models.DateTimeField(null=True, blank=True)
    min_lease_hours = models.PositiveIntegerField(default=1)
    set_by = models.CharField(max_length=150)
    set_at = models.DateTimeField(auto_now_add=True)
    superseded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(price_micros__gte=0), name="gpu_price_not_negative"),
            models.UniqueConstraint(fields=["gpu"], condition=Q(superseded_at__isnull=True),
                                    name="one_current_price_per_gpu"),
            models.CheckConstraint(
                condition=Q(offered_from__isnull=True) | Q(offered_until__isnull=True)
                | Q(offered_until__gt=F("offered_from")),
                name="gpu_price_window_ordered",
            ),
        ]
        indexes = [models.Index(fields=["gpu", "-set_at"])]

    def __str__(self):
        return f"gpu {self.gpu_id}: {self.price_micros} µ$/h"


# --- leases ---------------------------------------------------------------------------------


class Lease(models.Model):
    """GPUs a tenant won, for a time range. Its state changes only through
    `market.leasing.change_lease_state`, which writes a `LeaseEvent` per change."""

    class State(models.TextChoices):
        PENDING = "pending"
        PLACING = "placing"
        ACTIVE = "active"
        PREEMPTING = "preempting"
        PREEMPTED = "preempted"
        COMPLETED = "completed"
        TERMINATED = "terminated"
        FAILED = "failed"

    class Tier(models.TextChoices):
        ON_DEMAND = "on_demand"
        SPOT = "spot"
        RESERVED = "reserved"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="leases")
    tier = models.CharField(max_length=10, choices=Tier.choices)
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    gpu_model = models.CharField(max_length=40)
    gpu_count = models.PositiveIntegerField()
    price_micros = models.BigIntegerField(help_text="per GPU-hour, as sold")
    max_price_micros = models.BigIntegerField(help_text="the tenant's limit per GPU-hour")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    locality = models.JSONField(default=dict, help_text="leaves, spines, max_hops")
    preempt_at = models.DateTimeField(null=True, blank=True)
    quota_node = models.ForeignKey("pool.QuotaNode", null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="leases",
                                   help_text="private pools: the queue whose quota it uses")
    priority = models.IntegerField(default=0)
    allow_moves = models.BooleanField(
        default=False, help_text="the tenant lets the scheduler move it for planned work "
                                 "(draining a node, defragmentation)")
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")),
                                   name="lease_ends_after_it_starts"),
            models.CheckConstraint(condition=Q(gpu_count__gt=0), name="lease_has_gpus"),
            models.CheckConstraint(condition=Q(price_micros__gte=0)
                                   & Q(price_micros__lte=F("max_price_micros")),
                                   name="lease_price_within_limit"),
        ]
        indexes = [models.Index(fields=["state", "ends_at"])]

    def __str__(self):
        return f"lease {self.pk} ({self.state})"

    @property
    def reference(self) -> str:
        """`L-<id>`: how node bindings and money rows, which know no leases, name it."""
        return lease_ref(self.pk)


class LeaseEvent(models.Model):
    """A lease's history: every state change (who, when, why) and notices such as preemption."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=12, blank=True)
    to_state = models.CharField(max_length=12, blank=True)
    kind = models.CharField(max_length=30, default="state")
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"lease {self.lease_id}: {self.kind} {self.from_state} → {self.to_state}"


class Allocation(models.Model):
    """One GPU held by one lease for a time range. PostgreSQL's exclusion constraint makes two
    leases holding one GPU at overlapping times impossible, whatever the code does."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("pool.Gpu", on_delete=models.PROTECT, related_name="allocations")
    period = DateTimeRangeField()
    price_micros = models.BigIntegerField(help_text="the GPU's posted price when sold")

    class Meta:
        constraints = [
            ExclusionConstraint(
                name="no_gpu_in_two_overlapping_allocations",
                expressions=[("gpu", RangeOperators.EQUAL), ("period", RangeOperators.OVERLAPS)],
            ),
        ]

    def __str__(self):
        return f"gpu {self.gpu_id} for lease {self.lease_id}"


# --- orders -------------------------------------------------------------------------------


class Order(models.Model):
    """A tenant's bid for GPUs. Its state changes only through `market.orders`."""

    class State(models.TextChoices):
        OPEN = "open"
        RESTING = "resting"
        FILLED = "filled"
        REFUSED = "refused"
        CANCELLED = "cancelled"
        EXPIRED = "expired"
        QUEUED = "queued"  # a private-pool order waiting for quota admission

    class Fill(models.TextChoices):
        FILL_OR_KILL = "fill_or_kill"
        REST = "rest"

    tenant = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="orders")
    idempotency_key = models.CharField(max_length=100, blank=True)
    gpu_models = ArrayField(models.CharField(max_length=40))
    gpus = models.PositiveIntegerField()
    hours = models.PositiveIntegerField()
    tier = models.CharField(max_length=10, choices=Lease.Tier.choices)
    max_price_micros = models.BigIntegerField()
    topology = models.JSONField(default=dict)
    start_earliest = models.DateTimeField(null=True, blank=True)
    start_latest = models.DateTimeField(null=True, blank=True)
    fill = models.CharField(max_length=12, choices=Fill.choices, default=Fill.FILL_OR_KILL)
    allow_moves = models.BooleanField(default=False,
                                      help_text="passed on to its lease (Lease.allow_moves)")
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    reason = models.CharField(max_length=500, blank=True)
    lease = models.OneToOneField(Lease, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="order")
    pool = models.ForeignKey("pool.Pool", null=True, blank=True, on_delete=models.PROTECT,
                             related_name="orders", help_text="a private pool: priced in quota")
    quota_node = models.ForeignKey("pool.QuotaNode", null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="orders")
    priority = models.IntegerField(default=0)
    priority_class = models.ForeignKey(
        "pool.PriorityClass", null=True, blank=True, on_delete=models.SET_NULL,
        related_name="orders", help_text="the pool's named priority it gave (its value is "
                                         "`priority`)")
    queue_position = models.PositiveIntegerField(null=True, blank=True,
                                                 help_text="1 = next; set while queued")
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"],
                                    condition=~Q(idempotency_key=""),
                                    name="order_idempotency_key_unique_per_tenant"),
            models.CheckConstraint(condition=Q(gpus__gt=0) & Q(hours__gt=0)
                                   & Q(max_price_micros__gte=0), name="order_quantities_positive"),
            models.CheckConstraint(condition=Q(pool__isnull=True)
                                   | (Q(quota_node__isnull=False) & Q(max_price_micros=0)),
                                   name="pool_order_in_a_queue_and_unpriced"),
        ]
        indexes = [models.Index(fields=["tier", "state"])]

    def __str__(self):
        return f"order {self.pk} ({self.state})"


class OrderEvent(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=10, blank=True)
    to_state = models.CharField(max_length=10)
    actor = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"order {self.order_id}: {self.from_state} → {self.to_state}"


class Clearing(models.Model):
    """One batch-auction clearing of one market (GPU model) for one interval; the unique
    constraint makes a second clearing of the same interval impossible, even with two beats."""

    gpu_model = models.CharField(max_length=40)
    interval_start = models.DateTimeField()
    cleared_at = models.DateTimeField(auto_now_add=True)
    price_micros = models.BigIntegerField(null=True, blank=True)
    gpus_sold = models.PositiveIntegerField(default=0)
    accepted = models.JSONField(default=list, help_text="[{order, lease, gpus, price}]")
    refused = models.JSONField(default=list, help_text="[{order, reason}]")
    exact = models.JSONField(null=True, blank=True, help_text="welfare of the exact solution")

    class Meta:
        ordering = ["-interval_start"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "interval_start"],
                                    name="one_clearing_per_market_and_interval"),
        ]

    def __str__(self):
        return f"{self.gpu_model} @ {self.interval_start:%Y-%m-%d %H:%M}"

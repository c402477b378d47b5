"""Trading: per-GPU prices, orders (bids), auction clearings, leases and their allocations.

The money these move (holds, usage, payouts) lives in `billing`.
"""

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import ArrayField, DateTimeRangeField, RangeOperators
from django.db import models
from django.db.models import F, Q

from ibex.accounts.models import Organization
from ibex.references import lease_ref
from ibex.statemachine import StateChange
from market.core.workloads import MAX_SLURM_ACCOUNT_CHARS, SLURM_ACCOUNT_PATTERN

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
    workload = models.JSONField(null=True, blank=True,
                                help_text="what the nodes run: command, env, workdir (from the "
                                          "order; market.core.workloads)")
    ssh_keys = ArrayField(models.TextField(), default=list, blank=True,
                          help_text="OpenSSH public keys let into the lease's nodes")
    slurm_account = models.CharField(
        max_length=MAX_SLURM_ACCOUNT_CHARS, blank=True, default="",
        help_text="the Slurm account its reservations on Slurm nodes are made for (from the "
                  "order; market.core.workloads)")
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")),
                                   name="lease_ends_after_it_starts"),
            models.CheckConstraint(condition=Q(gpu_count__gt=0), name="lease_has_gpus"),
            models.CheckConstraint(condition=Q(slurm_account__regex=SLURM_ACCOUNT_PATTERN),
                                   name="lease_slurm_account_well_formed"),
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


class LeaseEvent(StateChange):
    """A lease's history: every state change (who, when, why) and notices such as preemption
    (`kind` other than "state", with no states)."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")
    to_state = models.CharField(max_length=12, blank=True)
    kind = models.CharField(max_length=30, default="state")

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
    workload = models.JSONField(null=True, blank=True, help_text="passed on to its lease")
    ssh_keys = ArrayField(models.TextField(), default=list, blank=True,
                          help_text="passed on to its lease")
    slurm_account = models.CharField(max_length=MAX_SLURM_ACCOUNT_CHARS, blank=True, default="",
                                     help_text="passed on to its lease")
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
            models.CheckConstraint(condition=Q(slurm_account__regex=SLURM_ACCOUNT_PATTERN),
                                   name="order_slurm_account_well_formed"),
        ]
        indexes = [models.Index(fields=["tier", "state"])]

    def __str__(self):
        return f"order {self.pk} ({self.state})"


class OrderEvent(StateChange):
    """An order's history: one row per state change, with who and why."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")

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

"""Trading: per-GPU prices, orders (bids), auction clearings, leases and their allocations.

The money these move (holds, usage, payouts) lives in `billing`.
"""

from django.contrib.postgres.constraints import ExclusionConstraint
from django.contrib.postgres.fields import (
    ArrayField,
    DateTimeRangeField,
    IntegerRangeField,
    RangeOperators,
)
from django.db import models
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.db.models import F, Q

from fabric.core import qos
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
    slice_prices = models.JSONField(
        default=dict, blank=True,
        help_text="MIG profile → micro-dollars per slice-hour, where the provider set one (a "
                  "profile not named is priced by its share of compute: market.parts)")

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

# Parts of GPUs (MIG slices or shares) are sold on demand or spot only, one kind at a time.
PARTS_WELL_FORMED = (
    (Q(mig_profile="") & Q(gpu_share__isnull=True))
    | (~Q(mig_profile="") & Q(gpu_share__isnull=True) & Q(tier__in=["on_demand", "spot"]))
    | (Q(mig_profile="") & Q(gpu_share__gte=1) & Q(gpu_share__lte=999)
       & Q(tier__in=["on_demand", "spot"]))
)


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
    gpu_count = models.PositiveIntegerField(help_text="GPUs, or parts (slices or shares)")
    mig_profile = models.CharField(max_length=20, blank=True,
                                   help_text="a lease of MIG slices: their profile")
    gpu_share = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="a lease of shares: each share's thousandths of a GPU")
    price_micros = models.BigIntegerField(help_text="per GPU-hour (per part-hour), as sold")
    max_price_micros = models.BigIntegerField(help_text="the tenant's limit per GPU-hour "
                                                        "(per part-hour)")
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
            models.CheckConstraint(condition=PARTS_WELL_FORMED, name="lease_parts_well_formed"),
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

    @property
    def unit(self) -> str:
        """What one of its `gpu_count` is, as prices are read: GPU, slice or share."""
        return "slice" if self.mig_profile else "share" if self.gpu_share is not None else "GPU"

    @property
    def product(self) -> str:
        """`8 × H100-80GB`, `2 × 1g.10gb of H100-80GB`, `1 × share 250/1000 of H100-80GB`."""
        if self.mig_profile:
            return f"{self.gpu_count} × {self.mig_profile} of {self.gpu_model}"
        if self.gpu_share is not None:
            return f"{self.gpu_count} × share {self.gpu_share}/1000 of {self.gpu_model}"
        return f"{self.gpu_count} × {self.gpu_model}"


class LeaseEvent(StateChange):
    """A lease's history: every state change (who, when, why) and notices such as preemption
    (`kind` other than "state", with no states)."""

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="events")
    to_state = models.CharField(max_length=12, blank=True)
    kind = models.CharField(max_length=30, default="state")

    def __str__(self):
        return f"lease {self.lease_id}: {self.kind} {self.from_state} → {self.to_state}"


def whole_gpu_span() -> NumericRange:
    return NumericRange(0, 1000)


class Allocation(models.Model):
    """One GPU, or one part of it, held by one lease for a time range.

    A part holds a `span` of its GPU in thousandths (a whole GPU [0, 1000); a MIG slice its
    memory-slice positions; a share a run of its width: scheduler.core.placement.parts).
    PostgreSQL's exclusion constraints make two allocations of overlapping spans of one GPU at
    overlapping times impossible, and slices and shares on one GPU at once, whatever the code
    does."""

    class Part(models.TextChoices):
        WHOLE = "whole"
        MIG = "mig"
        SHARE = "share"

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey("pool.Gpu", on_delete=models.PROTECT, related_name="allocations")
    period = DateTimeRangeField()
    price_micros = models.BigIntegerField(help_text="the posted price per hour when sold (of "
                                                    "the GPU, or of the part)")
    part = models.CharField(max_length=5, choices=Part.choices, default=Part.WHOLE)
    span = IntegerRangeField(default=whole_gpu_span,
                             help_text="thousandths of the GPU held: [0, 1000) for a whole GPU")
    mig_profile = models.CharField(max_length=20, blank=True)

    class Meta:
        constraints = [
            ExclusionConstraint(
                name="no_gpu_in_two_overlapping_allocations",
                expressions=[("gpu", RangeOperators.EQUAL), ("period", RangeOperators.OVERLAPS),
                             ("span", RangeOperators.OVERLAPS)],
            ),
            # (the name starts like the first one's: a refusal reads the same)
            ExclusionConstraint(
                name="no_gpu_in_two_overlapping_allocations_of_slices_and_shares",
                expressions=[("gpu", RangeOperators.EQUAL), ("period", RangeOperators.OVERLAPS),
                             ("part", RangeOperators.NOT_EQUAL)],
                condition=~Q(part="whole"),
            ),
            models.CheckConstraint(
                condition=Q(span__contained_by=NumericRange(0, 1000)) & Q(span__isempty=False) & (
                    (Q(part="whole") & Q(span=NumericRange(0, 1000)) & Q(mig_profile=""))
                    | (Q(part="mig") & ~Q(mig_profile=""))
                    | (Q(part="share") & Q(mig_profile="") & ~Q(span=NumericRange(0, 1000)))),
                name="allocation_part_well_formed"),
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
    gpus = models.PositiveIntegerField(help_text="GPUs, or parts (the API's `count`) with "
                                                 "mig_profile or gpu_share")
    mig_profile = models.CharField(max_length=20, blank=True, help_text="MIG slices of it")
    gpu_share = models.PositiveSmallIntegerField(null=True, blank=True,
                                                 help_text="shares of this many thousandths")
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
    alternatives = models.JSONField(
        default=list, blank=True,
        help_text="an auction bid over 2-8 shapes, at most one of which wins: [{gpus, "
                  "gpu_models, topology, hours, max_price_micros}]; the shape fields above are "
                  "the first until one wins, then the winner")
    alternative = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="the index of the shape that won (0 for a bid of one "
                                         "shape); None until one has")
    price_to_win_micros = models.BigIntegerField(
        null=True, blank=True, help_text="refused at the last clearing: the lowest limit per "
                                         "GPU-hour that would have won it")
    price_to_win_reason = models.CharField(
        max_length=300, blank=True, help_text="why no price would have won, or how "
                                              "price_to_win was found")
    bandwidth_class = models.CharField(
        max_length=12, choices=[(c, c) for c in qos.CLASSES], default=qos.STANDARD,
        help_text="its traffic class on the fabric (fabric.core.qos); passed on to its lease")
    gbps_per_gpu = models.DecimalField(
        max_digits=6, decimal_places=1, null=True, blank=True,
        help_text="guaranteed: the Gb/s reserved per GPU on every link of its routes")
    created_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(bandwidth_class=qos.GUARANTEED) & Q(gbps_per_gpu__gt=0))
                | (~Q(bandwidth_class=qos.GUARANTEED) & Q(gbps_per_gpu__isnull=True)),
                name="order_guarantee_only_for_guaranteed"),
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
            models.CheckConstraint(condition=PARTS_WELL_FORMED, name="order_parts_well_formed"),
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
    welfare = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True,
                                  help_text="dollars: winners' limits less the GPUs' reserves, "
                                            "over their hours")
    welfare_bound = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True,
                                        help_text="no clearing of this book has more welfare")
    gap = models.DecimalField(max_digits=9, decimal_places=6, null=True, blank=True,
                              help_text="(bound - welfare) / bound, certified")
    optimal = models.BooleanField(null=True, blank=True,
                                  help_text="False when the time budget cut the search short")
    book = models.JSONField(null=True, blank=True,
                            help_text="the book it was solved from (manage.py export_book)")

    class Meta:
        ordering = ["-interval_start"]
        constraints = [
            models.UniqueConstraint(fields=["gpu_model", "interval_start"],
                                    name="one_clearing_per_market_and_interval"),
        ]

    def __str__(self):
        return f"{self.gpu_model} @ {self.interval_start:%Y-%m-%d %H:%M}"

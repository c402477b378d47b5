"""Placement of won leases, binding, preemption and SLA enforcement.

SLA rows (`LeaseSla`, `SlaCredit`), which change only through `scheduler/sla.py`, and
defragmentation runs (`DefragRun`). Tenant events and webhooks are `notify`'s.
"""

from django.db import models
from django.db.models import Q


class LeaseSla(models.Model):
    """The service level promised to one lease at sale; empty targets: none promised (spot)."""

    lease = models.OneToOneField("market.Lease", on_delete=models.CASCADE, related_name="sla")
    tier = models.CharField(max_length=10)
    availability_target_bp = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPU availability over the lease, basis points (9950)")
    activation_limit_s = models.PositiveIntegerField(
        null=True, blank=True, help_text="most seconds from winning (or the start) to active")
    promised_locality = models.JSONField(default=dict, blank=True,
                                         help_text="the lease's locality at sale (multi-node)")
    # the last measurement, cached for operators (the API measures afresh)
    measured_at = models.DateTimeField(null=True, blank=True)
    down_gpu_seconds = models.BigIntegerField(default=0)
    lease_gpu_seconds = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "lease SLA"
        constraints = [
            models.CheckConstraint(
                condition=Q(availability_target_bp__isnull=True)
                | Q(availability_target_bp__lte=10_000), name="sla_target_at_most_100_percent"),
        ]

    def __str__(self):
        return f"SLA of lease {self.lease_id}"


class SlaCredit(models.Model):
    """One credit for one lease's measurement window [window_start, window_end): the increment
    of what the lease was owed since its last credit. The next window starts where this one
    ended, so two runs that read the same last credit collide on the unique constraint."""

    lease = models.ForeignKey("market.Lease", on_delete=models.PROTECT,
                              related_name="sla_credits")
    window_start = models.DateTimeField()
    window_end = models.DateTimeField()
    down_gpu_seconds = models.BigIntegerField(help_text="measured over the lease so far")
    lease_gpu_seconds = models.BigIntegerField()
    activation_s = models.PositiveIntegerField(null=True, blank=True)
    owed_micros = models.BigIntegerField(help_text="all the lease was owed at window_end")
    amount_micros = models.BigIntegerField(help_text="this credit: owed less earlier credits")
    reason = models.CharField(max_length=500)
    transaction = models.OneToOneField("billing.LedgerTransaction", on_delete=models.PROTECT,
                                       null=True, blank=True, related_name="sla_credit")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["window_start", "id"]
        constraints = [
            models.UniqueConstraint(fields=["lease", "window_start"],
                                    name="one_sla_credit_per_lease_window"),
            models.CheckConstraint(condition=Q(amount_micros__gt=0),
                                   name="sla_credit_positive"),
            models.CheckConstraint(condition=Q(window_end__gt=models.F("window_start")),
                                   name="sla_credit_window_ordered"),
        ]

    def __str__(self):
        return f"credit {self.pk} for lease {self.lease_id}"


class DefragRun(models.Model):
    """One defragmentation pass (`scheduler/moves/defrag.py`): the free whole leaves and nodes
    before and after it, and what it moved. Written once, at the end of the pass."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    whole_free_leaves_before = models.PositiveIntegerField()
    whole_free_leaves_after = models.PositiveIntegerField()
    whole_free_nodes_before = models.PositiveIntegerField()
    whole_free_nodes_after = models.PositiveIntegerField()
    moves_planned = models.PositiveIntegerField(default=0)
    moves_applied = models.PositiveIntegerField(default=0)
    moves = models.JSONField(default=list, blank=True,
                             help_text="[{lease, away_from, onto, applied, why}]")

    class Meta:
        ordering = ["-started_at", "-id"]
        verbose_name = "defragmentation run"

    def __str__(self):
        return (f"defrag {self.started_at:%Y-%m-%d %H:%M}: whole free leaves "
                f"{self.whole_free_leaves_before} → {self.whole_free_leaves_after}")


class LeaseLinkNotice(models.Model):
    """A faulty link on a live lease's path, as the scheduler told the lease (one row per lease
    and fault): the hosts of the lease the link serves, the span it was faulty (copied from the
    fabric's `LinkFault`, which a re-import may delete), and whether the lease was told that it
    is back. The SLA counts the lease's GPUs on those hosts down for the span
    (`scheduler/sla.py`); `scheduler/link_health.py` alone writes these rows."""

    lease = models.ForeignKey("market.Lease", on_delete=models.CASCADE,
                              related_name="link_notices")
    fault = models.ForeignKey("fabric.LinkFault", null=True, blank=True,
                              on_delete=models.SET_NULL, related_name="notices")
    link_name = models.CharField(max_length=300)
    kind = models.CharField(max_length=10, help_text="down or errors")
    detail = models.CharField(max_length=300, blank=True)
    host_ids = models.JSONField(default=list, help_text="fabric hosts of the lease it serves")
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "fault"], name="one_notice_per_lease_fault"),
        ]
        indexes = [models.Index(fields=["ended_at"])]

    def __str__(self):
        return f"lease {self.lease_id}: {self.link_name} {self.kind}"

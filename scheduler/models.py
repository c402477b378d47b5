"""Placement of won leases, binding, preemption and SLA enforcement.

SLA rows (`LeaseSla`, `SlaCredit`), tenant-facing events (`Event`) and webhook delivery
(`WebhookEndpoint`, `WebhookDelivery`, `WebhookAttempt`). They change only through
`scheduler/sla.py`, `scheduler/events.py` and `scheduler/webhooks.py`.
"""

from django.db import models
from django.db.models import Q

from ibex.accounts.models import Organization


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
    transaction = models.OneToOneField("market.LedgerTransaction", on_delete=models.PROTECT,
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


class Event(models.Model):
    """Something a tenant may want to hear about one of its leases; stored once per source
    (a lease's state change, a health event on its GPUs, an SLA credit)."""

    class Kind(models.TextChoices):
        STARTED = "lease.started"
        PREEMPTION_NOTICE = "lease.preemption_notice"
        PREEMPTED = "lease.preempted"
        DEGRADED = "lease.degraded"
        MOVED = "lease.moved"
        CREDITED = "lease.credited"
        ENDED = "lease.ended"

    tenant = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="events")
    lease = models.ForeignKey("market.Lease", on_delete=models.CASCADE, related_name="tenant_events")
    kind = models.CharField(max_length=30, choices=Kind.choices)
    source = models.CharField(max_length=60, help_text="what caused it: lease_event:12, ...")
    payload = models.JSONField(default=dict)
    occurred_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["lease", "source"], name="one_event_per_lease_source"),
        ]
        indexes = [models.Index(fields=["tenant", "-id"]),
                   models.Index(fields=["tenant", "created_at"])]

    def __str__(self):
        return f"{self.kind} lease {self.lease_id}"


class WebhookEndpoint(models.Model):
    """A URL of a tenant's that receives its events, signed with the endpoint's secret."""

    tenant = models.ForeignKey(Organization, on_delete=models.CASCADE,
                               related_name="webhook_endpoints")
    url = models.URLField(max_length=500)
    secret = models.CharField(max_length=100, help_text="shown once, at creation")
    description = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["tenant", "active"])]

    def __str__(self):
        return self.url


class WebhookDelivery(models.Model):
    """One event to one endpoint: unique, so it is sent until a 2xx, and never after."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    status_code = models.PositiveIntegerField(null=True, blank=True, help_text="the last answer")
    error = models.CharField(max_length=500, blank=True)
    next_attempt_at = models.DateTimeField(help_text="due from then (or, sending: claim expiry)")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "event"], name="one_delivery_per_event"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self):
        return f"event {self.event_id} → endpoint {self.endpoint_id} ({self.state})"


class WebhookAttempt(models.Model):
    """The delivery log: one row per try, with the answer or the error."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE,
                                 related_name="attempt_log")
    number = models.PositiveIntegerField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    at = models.DateTimeField()

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="one_log_row_per_try"),
        ]

    def __str__(self):
        return f"try {self.number} of delivery {self.delivery_id}"


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

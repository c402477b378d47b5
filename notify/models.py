"""Tenant events and webhook delivery: `Event`, `WebhookEndpoint`, `WebhookDelivery`,
`WebhookAttempt`. They change only through `notify/events.py` and `notify/webhooks.py`.

These models began in the scheduler app and keep its table names (`Meta.db_table`), so moving
them here moved no data.
"""

from django.db import models

from ibex.accounts.models import Organization


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
        db_table = "scheduler_event"
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
        db_table = "scheduler_webhookendpoint"
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
        db_table = "scheduler_webhookdelivery"
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
        db_table = "scheduler_webhookattempt"
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="one_log_row_per_try"),
        ]

    def __str__(self):
        return f"try {self.number} of delivery {self.delivery_id}"

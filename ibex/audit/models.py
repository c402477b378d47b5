"""The audit log: who did what, to what, when and from where, for every operator action and
every movement of money someone asked for. Append-only: PostgreSQL refuses UPDATE and DELETE.

Nothing here points at other tables: the actor, target and organisation are kept as text, so
an entry outlives what it names and this app imports nothing from the rest of IBEX.
"""

from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.CharField(max_length=150, help_text="a user name, or system / stripe")
    via = models.CharField(max_length=60, blank=True,
                           help_text="how: an API key (its prefix), the web, the admin, a task")
    ip = models.GenericIPAddressField(null=True, blank=True, help_text="where the request came from")
    action = models.CharField(max_length=60, db_index=True)
    target_type = models.CharField(max_length=60, blank=True)
    target_id = models.CharField(max_length=64, blank=True)
    organization = models.CharField(max_length=64, blank=True, db_index=True,
                                    help_text="the organisation acted on (its slug)")
    amount_micros = models.BigIntegerField(null=True, blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["target_type", "target_id"])]

    def __str__(self):
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.target_type}:{self.target_id}"

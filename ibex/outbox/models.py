"""Work to hand to Celery, recorded in the same transaction as the change that caused it."""

from django.db import models


class OutboxMessage(models.Model):
    task = models.CharField(max_length=200)
    args = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)

    class Meta:
        indexes = [models.Index(fields=["sent_at", "id"])]

    def __str__(self):
        return f"{self.task}{tuple(self.args)} ({'sent' if self.sent_at else 'pending'})"

"""Every add, change and delete made through the Django admin is also an audit entry (the
admin's own LogEntry has no address and may be edited; the audit log has and may not)."""

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.db.models.signals import post_save
from django.dispatch import receiver

from ibex.audit.services import record_audit

VERBS = {ADDITION: "add", CHANGE: "change", DELETION: "delete"}


@receiver(post_save, sender=LogEntry, dispatch_uid="ibex-audit-admin-log")
def _mirror(sender, instance: LogEntry, created: bool, **kwargs):
    if not created:
        return
    model = instance.content_type.model_class() if instance.content_type_id else None
    label = model._meta.label_lower if model else "unknown"
    record_audit(action=f"admin.{VERBS.get(instance.action_flag, 'other')}",
                 target=f"{label}:{instance.object_id or ''}", actor=instance.user.get_username(),
                 via="admin", details={"object": instance.object_repr[:200],
                                       "change": instance.get_change_message()[:500]})

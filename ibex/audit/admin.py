from django.contrib import admin

from ibex.admin import ReadOnlyAdmin
from ibex.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    """Read-only: operators read the log; nobody adds, changes or deletes an entry."""

    list_display = ["at", "actor", "via", "ip", "action", "target_type", "target_id",
                    "organization", "amount_micros"]
    list_filter = ["action", "via"]
    search_fields = ["actor", "action", "target_id", "organization", "ip"]
    date_hierarchy = "at"
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

from django.contrib import admin

from ibex.outbox.models import OutboxMessage


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "args", "created_at", "sent_at", "attempts", "last_error"]
    list_filter = ["task"]
    readonly_fields = list_display

from django.contrib import admin

from ibex.admin import ReadOnlyAdmin
from notify.models import Event, WebhookAttempt, WebhookDelivery, WebhookEndpoint


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "tenant", "lease", "occurred_at", "created_at"]
    list_filter = ["kind"]
    search_fields = ["tenant__slug", "source"]


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["number", "status_code", "error", "next_attempt_at", "at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ["id", "endpoint", "event", "state", "attempts", "status_code",
                    "next_attempt_at"]
    list_filter = ["state"]
    inlines = [WebhookAttemptInline]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "url", "active", "created_at"]
    list_filter = ["active"]
    exclude = ["secret"]

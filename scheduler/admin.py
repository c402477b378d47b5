from django.contrib import admin

from billing.core.money import to_dollars
from scheduler.models import (
    DefragRun,
    Event,
    LeaseSla,
    SlaCredit,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """These rows change only through scheduler services: operators watch them here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LeaseSla)
class LeaseSlaAdmin(ReadOnlyAdmin):
    list_display = ["lease", "tier", "availability_target_bp", "activation_limit_s",
                    "down_gpu_seconds", "lease_gpu_seconds", "measured_at"]
    list_filter = ["tier"]


@admin.register(SlaCredit)
class SlaCreditAdmin(ReadOnlyAdmin):
    list_display = ["lease", "window_start", "window_end", "amount", "reason"]
    list_select_related = ["lease"]

    @admin.display(description="amount (USD)")
    def amount(self, credit):
        return to_dollars(credit.amount_micros)


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


@admin.register(DefragRun)
class DefragRunAdmin(ReadOnlyAdmin):
    list_display = ["started_at", "whole_free_leaves_before", "whole_free_leaves_after",
                    "whole_free_nodes_before", "whole_free_nodes_after", "moves_planned",
                    "moves_applied"]
    date_hierarchy = "started_at"

from django.contrib import admin

from billing.core.money import to_dollars
from ibex.admin import ReadOnlyAdmin
from scheduler.models import DefragRun, LeaseSla, SlaCredit


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


@admin.register(DefragRun)
class DefragRunAdmin(ReadOnlyAdmin):
    list_display = ["started_at", "whole_free_leaves_before", "whole_free_leaves_after",
                    "whole_free_nodes_before", "whole_free_nodes_after", "moves_planned",
                    "moves_applied"]
    date_hierarchy = "started_at"

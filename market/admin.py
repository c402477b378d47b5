from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from billing.core import money
from ibex.admin import ReadOnlyAdmin
from market import leasing
from market.models import Allocation, Clearing, Lease, LeaseEvent, Order, OrderEvent


class LeaseEventInline(admin.TabularInline):
    model = LeaseEvent
    fields = ["at", "kind", "from_state", "to_state", "actor", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class AllocationInline(admin.TabularInline):
    model = Allocation
    fields = ["gpu", "period", "price_micros"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


class CancelLeaseForm(forms.Form):
    reason = forms.CharField(max_length=400, help_text="Recorded on the lease and the ledger.")


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "tier", "state", "gpu_model", "gpu_count", "price",
                    "starts_at", "ends_at", "locality_summary"]
    list_filter = ["state", "tier", "gpu_model", "starts_at"]
    search_fields = ["=id", "tenant__slug", "tenant__name"]
    list_select_related = ["tenant"]
    date_hierarchy = "starts_at"
    inlines = [LeaseEventInline, AllocationInline]
    actions = ["cancel_with_refund"]

    @admin.display(description="price / GPU-h (USD)", ordering="price_micros")
    def price(self, lease):
        return money.to_dollars(lease.price_micros)

    @admin.display(description="locality")
    def locality_summary(self, lease):
        loc = lease.locality or {}
        if not loc:
            return "—"
        return f"{loc.get('leaves', '?')} leaves · {loc.get('spines', '?')} spines"

    @admin.action(description="Cancel selected leases and refund what they were charged")
    def cancel_with_refund(self, request, queryset):
        form = CancelLeaseForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            for lease in queryset.order_by("pk"):
                done = leasing.cancel_lease_with_refund(
                    lease_id=lease.pk, actor=request.user.get_username(),
                    reason=form.cleaned_data["reason"])
                self.message_user(request, done.detail, messages.SUCCESS)
            return None
        return TemplateResponse(request, "admin/market/lease/cancel_with_refund.html", {
            **self.admin_site.each_context(request), "title": "Cancel leases with a refund",
            "leases": queryset, "form": form, "opts": self.model._meta,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": "cancel_with_refund"})


class OrderEventInline(admin.TabularInline):
    model = OrderEvent
    fields = ["at", "from_state", "to_state", "actor", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Order)
class OrderAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "tier", "state", "gpus", "gpu_models", "hours", "limit",
                    "lease", "reason", "created_at"]
    list_filter = ["state", "tier", "fill", "created_at"]
    search_fields = ["=id", "tenant__slug", "reason"]
    list_select_related = ["tenant", "lease"]
    date_hierarchy = "created_at"
    inlines = [OrderEventInline]

    @admin.display(description="limit / GPU-h (USD)", ordering="max_price_micros")
    def limit(self, order):
        return money.to_dollars(order.max_price_micros)


@admin.register(Clearing)
class ClearingAdmin(ReadOnlyAdmin):
    list_display = ["gpu_model", "interval_start", "cleared_at", "price", "gpus_sold", "won",
                    "refused_bids"]
    list_filter = ["gpu_model", "interval_start"]
    search_fields = ["gpu_model"]
    date_hierarchy = "interval_start"

    @admin.display(description="price / GPU-h (USD)", ordering="price_micros")
    def price(self, clearing):
        return None if clearing.price_micros is None else money.to_dollars(clearing.price_micros)

    @admin.display(description="bids won")
    def won(self, clearing):
        return len(clearing.accepted)

    @admin.display(description="bids refused")
    def refused_bids(self, clearing):
        return len(clearing.refused)

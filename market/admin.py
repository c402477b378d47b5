from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse

from market import money, services
from market.models import (
    Account,
    Allocation,
    Clearing,
    ConnectAccount,
    CreditGrant,
    Entry,
    Hold,
    Lease,
    LeaseEvent,
    LedgerTransaction,
    MoneyStateChange,
    Order,
    OrderEvent,
    Payout,
    Refund,
    SpendLimit,
    StripeEvent,
    TopUp,
    UsageRecord,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Money rows change only through services: the admin shows them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class GrantCreditForm(forms.ModelForm):
    """An operator grants credit by adding a grant; the ledger records it like any money."""

    amount = forms.DecimalField(min_value=Decimal("0.01"), max_digits=14, decimal_places=6,
                                help_text="dollars")

    class Meta:
        model = CreditGrant
        fields = ["organization", "amount", "reason"]


@admin.register(Account)
class AccountAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "kind", "currency", "balance"]
    list_filter = ["kind", "currency"]
    search_fields = ["organization__slug"]
    list_select_related = ["organization"]

    @admin.display(description="balance (USD)")
    def balance(self, account):
        return money.to_dollars(account.balance_micros)


class EntryInline(admin.TabularInline):
    model = Entry
    fields = ["account", "amount_micros", "created_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdmin):
    list_display = ["id", "cause", "source_type", "source_id", "actor", "memo", "created_at"]
    list_filter = ["cause"]
    search_fields = ["source_id", "memo"]
    inlines = [EntryInline]


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    form = GrantCreditForm
    list_display = ["organization", "amount", "reason", "actor", "created_at"]
    search_fields = ["organization__slug", "reason"]

    @admin.display(description="amount (USD)")
    def amount(self, grant):
        return money.to_dollars(grant.amount_micros)

    def has_change_permission(self, request, obj=None):
        return obj is None

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        grant = services.grant_credit(organization=form.cleaned_data["organization"],
                                      amount_micros=money.to_micros(form.cleaned_data["amount"]),
                                      reason=form.cleaned_data["reason"],
                                      actor=request.user.get_username())
        obj.pk = grant.pk
        self.message_user(request, f"Granted {money.to_dollars(grant.amount_micros)} USD.",
                          messages.SUCCESS)


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = ["order_ref", "tenant", "amount_micros", "captured_micros", "released_micros",
                    "state", "created_at"]
    list_filter = ["state"]
    search_fields = ["order_ref", "tenant__slug"]


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdmin):
    list_display = ["lease_ref", "minute", "payer", "payee", "gpus", "seconds", "charge_micros",
                    "fee_micros"]
    search_fields = ["lease_ref"]


@admin.register(TopUp)
class TopUpAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "amount_micros", "refunded_micros", "state", "automatic",
                    "payment_intent_id", "created_at"]
    list_filter = ["state", "automatic"]
    actions = ["refund_unused"]

    @admin.action(description="Refund what is unrefunded, up to the tenant's available balance")
    def refund_unused(self, request, queryset):
        for top_up in queryset.select_related("tenant"):
            available = services.balances_of(top_up.tenant).available_micros
            amount = min(top_up.amount_micros - top_up.refunded_micros, available)
            amount -= amount % services.CENT
            if amount <= 0:
                self.message_user(request, f"{top_up}: nothing to refund", messages.WARNING)
                continue
            try:
                refund = services.request_refund(tenant=top_up.tenant, amount_micros=amount,
                                                 top_up=top_up,
                                                 actor=request.user.get_username())
            except services.MoneyError as exc:
                self.message_user(request, f"{top_up}: {exc.message}", messages.WARNING)
                continue
            self.message_user(request, f"{top_up}: refunding {money.to_dollars(amount)} USD "
                              f"(refund {refund.pk})", messages.SUCCESS)


@admin.register(Refund)
class RefundAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "top_up", "amount_micros", "state", "created_at"]
    list_filter = ["state"]


@admin.register(Payout)
class PayoutAdmin(ReadOnlyAdmin):
    list_display = ["id", "provider", "amount", "state", "stripe_payout_id", "last_error",
                    "created_at", "state_changed_at"]
    list_filter = ["state", "created_at"]
    search_fields = ["provider__slug", "stripe_payout_id", "stripe_transfer_id"]
    list_select_related = ["provider"]
    date_hierarchy = "created_at"
    actions = ["rerun"]

    @admin.display(description="amount (USD)", ordering="amount_micros")
    def amount(self, payout):
        return money.to_dollars(payout.amount_micros)

    @admin.action(description="Re-run selected payouts (pending: send again; failed: pay out "
                              "the payable balance anew)")
    def rerun(self, request, queryset):
        for payout in queryset.order_by("pk"):
            done = services.rerun_payout(payout=payout, actor=request.user.get_username())
            self.message_user(request, done.detail,
                              messages.WARNING if done.action == "nothing" else messages.SUCCESS)


@admin.register(ConnectAccount)
class ConnectAccountAdmin(ReadOnlyAdmin):
    list_display = ["organization", "stripe_account_id", "details_submitted", "payouts_enabled"]


@admin.register(SpendLimit)
class SpendLimitAdmin(admin.ModelAdmin):
    list_display = ["organization", "per_hour_micros", "per_month_micros",
                    "auto_top_up_below_micros", "auto_top_up_amount_micros"]


@admin.register(MoneyStateChange)
class MoneyStateChangeAdmin(ReadOnlyAdmin):
    list_display = ["at", "subject", "subject_id", "from_state", "to_state", "actor", "reason"]
    list_filter = ["subject"]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "outcome", "received_at"]
    list_filter = ["type"]
    search_fields = ["event_id"]



# --- leases, orders and auctions -------------------------------------------------------------------


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
                done = services.cancel_lease_with_refund(
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

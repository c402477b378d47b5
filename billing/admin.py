from decimal import Decimal

from django import forms
from django.contrib import admin, messages

from billing import services
from billing.core import money
from billing.models import (
    Account,
    ConnectAccount,
    CreditGrant,
    Entry,
    Hold,
    LedgerTransaction,
    MoneyStateChange,
    Payout,
    Refund,
    SpendLimit,
    StripeEvent,
    TopUp,
    UsageRecord,
)
from ibex.admin import ReadOnlyAdmin


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

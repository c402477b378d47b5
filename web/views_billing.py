"""The tenant's money: balances, the ledger, monthly invoices and card top-ups.

A top-up's PaymentIntent is made by a Celery task after the request commits, so the page polls
its status every second until the client secret is there (at most `POLL_TRIES` times).

Then, where Stripe.js is configured (settings.STRIPE_JS_URL: js.stripe.com with real keys, the
fake Stripe's in tests), the page mounts Stripe's card element (web/top_up_card.js) and
confirms the PaymentIntent in the browser; Stripe's webhook credits the balance and the page
polls until it has. Without Stripe.js (offline) nothing is loaded from outside: the page shows
the PaymentIntent to confirm elsewhere."""

import uuid

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET

from billing import invoices
from billing import services as money
from billing.core.money import to_micros
from billing.models import Entry, TopUp
from billing.services import balances_of
from web.orgs import tenant_required

ENTRIES = 25
TOP_UPS = 5
POLL_TRIES = 30  # a second apart: then the page stops asking and says so


class TopUpForm(forms.Form):
    amount = forms.DecimalField(label="Amount (USD)", min_value=0, decimal_places=2,
                                max_digits=12, help_text="Charged to a card through Stripe.")
    idempotency_key = forms.CharField(widget=forms.HiddenInput, required=False, max_length=100)


def _stripe_js() -> dict:
    """Where the card element comes from; empty where Stripe.js is not configured."""
    if settings.STRIPE_JS_URL and settings.STRIPE_PUBLISHABLE_KEY:
        return {"stripe_js_url": settings.STRIPE_JS_URL,
                "publishable_key": settings.STRIPE_PUBLISHABLE_KEY}
    return {"stripe_js_url": "", "publishable_key": ""}


def _account_context(org, query=None) -> dict:
    entries = Paginator(Entry.objects.filter(account__organization=org)
                        .select_related("transaction", "account").order_by("-id"),
                        ENTRIES).get_page((query or {}).get("entries"))
    return {"org": org, "balances": balances_of(org), "entries": entries,
            "months": invoices.months_with_activity(organization=org),
            "top_ups": TopUp.objects.filter(tenant=org).order_by("-created_at")[:TOP_UPS]}


@tenant_required
def account(request):
    org = request.organization
    form = TopUpForm(request.POST or None,
                     initial={"idempotency_key": uuid.uuid4().hex, "amount": "100.00"})
    if request.method == "POST" and form.is_valid():
        try:
            top_up = money.create_top_up(
                tenant=org, amount_micros=to_micros(form.cleaned_data["amount"]),
                idempotency_key=form.cleaned_data["idempotency_key"] or None,
                actor=request.user.get_username())
        except money.MoneyError as exc:
            form.add_error("amount" if exc.field == "amount" else None, exc.message)
        else:
            messages.success(request, f"Top-up {top_up.pk} started.")
            request.session["top_up"] = top_up.pk
            return redirect("web:account")
    current = None
    if request.method == "GET" and (top_up_id := request.session.get("top_up")):
        current = TopUp.objects.filter(tenant=org, pk=top_up_id).first()
        if current is None or current.state != TopUp.State.CREATED:
            request.session.pop("top_up", None)
    if form.is_bound and not form.errors:
        form = TopUpForm(initial={"idempotency_key": uuid.uuid4().hex})
    return render(request, "web/account.html", {**_account_context(org, request.GET), "form": form,
                                                 "top_up": current, **_stripe_js(),
                                                 "cards": money.card_payments_configured()},
                  status=400 if form.errors else 200)


@require_GET
@tenant_required
def top_up_status(request, top_up_id: int):
    top_up = get_object_or_404(TopUp, pk=top_up_id, tenant=request.organization)
    try:
        tries = max(0, int(request.GET.get("try", "0")))
    except ValueError:
        tries = 0
    return render(request, "web/partials/top_up.html", {
        "top_up": top_up, "next_try": tries + 1, "gave_up": tries >= POLL_TRIES,
        "confirmed": request.GET.get("confirmed") == "1",
        "balances": balances_of(request.organization), **_stripe_js()})


@require_GET
@tenant_required
def invoice(request, month: str):
    try:
        when = invoices.parse_month(month)
    except ValueError:
        raise Http404("months are written YYYY-MM") from None
    return render(request, "web/invoice.html", {
        "org": request.organization, "month": month,
        "invoice": invoices.invoice_for(tenant=request.organization, month=when)})

"""The only code that talks to Stripe. Called from Celery tasks, never inside a transaction.

Every call carries an idempotency key derived from our own row id, so a task retried after a
crash asks Stripe for the same object again instead of making a second one.
"""

from __future__ import annotations

import stripe
from django.conf import settings

from billing.core.money import stripe_minor_units
from billing.models import ConnectAccount, Payout, Refund, SpendLimit, TopUp

StripeError = stripe.StripeError


def client() -> stripe.StripeClient:
    return stripe.StripeClient(settings.STRIPE_API_KEY,
                               base_addresses={"api": settings.STRIPE_API_BASE},
                               max_network_retries=2)


def create_payment_intent(top_up: TopUp):
    params = {
        "amount": stripe_minor_units(top_up.amount_micros),
        "currency": top_up.currency,
        "metadata": {"ibex_top_up": str(top_up.pk), "ibex_org": top_up.tenant.slug},
        "automatic_payment_methods": {"enabled": True},
    }
    if top_up.automatic:
        limit = SpendLimit.objects.get(organization=top_up.tenant)
        params.update(customer=limit.stripe_customer_id,
                      payment_method=limit.stripe_payment_method_id, confirm=True,
                      off_session=True)
        params.pop("automatic_payment_methods")
    return client().v1.payment_intents.create(
        params=params, options={"idempotency_key": top_up.stripe_idempotency_key})


def create_refund(refund: Refund):
    return client().v1.refunds.create(
        params={"payment_intent": refund.top_up.payment_intent_id,
                "amount": stripe_minor_units(refund.amount_micros),
                "metadata": {"ibex_refund": str(refund.pk)}},
        options={"idempotency_key": refund.stripe_idempotency_key})


def create_connect_account(connect: ConnectAccount) -> tuple[str, str]:
    """The Express account (made once) and a fresh onboarding link: (account id, url)."""
    stripe_client = client()
    account_id = connect.stripe_account_id
    if not account_id:
        account = stripe_client.v1.accounts.create(
            params={"type": "express", "metadata": {"ibex_org": connect.organization.slug},
                    "capabilities": {"transfers": {"requested": True}}},
            options={"idempotency_key": connect.stripe_idempotency_key})
        account_id = account.id
    link = stripe_client.v1.account_links.create(params={
        "account": account_id, "type": "account_onboarding",
        "refresh_url": settings.STRIPE_CONNECT_REFRESH_URL,
        "return_url": settings.STRIPE_CONNECT_RETURN_URL,
    })
    return account_id, link.url


def send_payout(payout: Payout) -> tuple[str, str]:
    """Transfer to the provider's Connect account, then pay it out to their bank."""
    stripe_client = client()
    destination = payout.provider.connect_account.stripe_account_id
    amount = stripe_minor_units(payout.amount_micros)
    metadata = {"ibex_payout": str(payout.pk)}
    transfer = stripe_client.v1.transfers.create(
        params={"amount": amount, "currency": "usd", "destination": destination,
                "metadata": metadata},
        options={"idempotency_key": f"{payout.stripe_idempotency_key}-transfer"})
    bank_payout = stripe_client.v1.payouts.create(
        params={"amount": amount, "currency": "usd", "metadata": metadata},
        options={"idempotency_key": payout.stripe_idempotency_key,
                 "stripe_account": destination})
    return transfer.id, bank_payout.id


def verify_webhook(payload: bytes, signature: str) -> dict:
    """The event, if Stripe signed it; raises stripe.SignatureVerificationError or ValueError."""
    event = stripe.Webhook.construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET)
    return event.to_dict()

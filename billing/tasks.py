"""Celery tasks for money: thin wrappers that call Stripe (outside any transaction) or services.

Their names start with `market.` because they were born there; names are what the queues and
the outbox carry, so they stay.
"""

from celery import shared_task
from django.conf import settings

from billing import services, stripe_gateway
from billing.models import ConnectAccount, Payout, Refund, TopUp

PAYMENT_INTENT_TRIES = 6


def stripe_refused(exc: stripe_gateway.StripeError) -> bool:
    """Stripe said no for good (a 4xx other than rate limiting): retrying cannot help."""
    return bool(exc.http_status and exc.http_status < 500 and exc.http_status != 429)


@shared_task(name="market.create_payment_intent", bind=True, max_retries=PAYMENT_INTENT_TRIES - 1)
def create_payment_intent(self, top_up_id: int) -> str:
    top_up = TopUp.objects.select_related("tenant").get(pk=top_up_id)
    if top_up.payment_intent_id or top_up.state != TopUp.State.CREATED:
        return top_up.payment_intent_id or top_up.state
    try:
        intent = stripe_gateway.create_payment_intent(top_up)
    except stripe_gateway.StripeError as exc:
        refused = stripe_refused(exc)
        if refused or self.request.retries >= self.max_retries:
            # never left `created` for ever: the tenant reads why it failed
            why = (exc.user_message or str(exc)) if refused else (
                f"Stripe could not be reached after {self.request.retries + 1} tries: {exc}")
            services.top_up_failed(top_up_id=top_up.pk, error=why, actor="stripe")
            return "refused" if refused else "failed"
        raise self.retry(exc=exc, countdown=2 ** self.request.retries) from None
    services.record_payment_intent(top_up=top_up, payment_intent_id=intent.id,
                                   client_secret=intent.client_secret)
    return intent.id


@shared_task(name="market.send_refund", autoretry_for=(stripe_gateway.StripeError,),
             retry_backoff=True, max_retries=5)
def send_refund(refund_id: int) -> str:
    refund = Refund.objects.select_related("top_up").get(pk=refund_id)
    if refund.state != Refund.State.PENDING:
        return refund.state
    try:
        stripe_refund = stripe_gateway.create_refund(refund)
    except stripe_gateway.StripeError as exc:
        if stripe_refused(exc):
            return services.refund_failed(refund_id=refund.pk, error=str(exc.user_message or exc))
        raise
    if stripe_refund.status == "succeeded":
        return services.refund_succeeded(refund_id=refund.pk, stripe_refund_id=stripe_refund.id)
    return stripe_refund.status


@shared_task(name="market.create_connect_account", autoretry_for=(stripe_gateway.StripeError,),
             retry_backoff=True, max_retries=5)
def create_connect_account(connect_id: int) -> str:
    connect = ConnectAccount.objects.select_related("organization").get(pk=connect_id)
    account_id, url = stripe_gateway.create_connect_account(connect)
    services.record_connect_account(connect=connect, stripe_account_id=account_id,
                                    onboarding_url=url)
    return account_id


@shared_task(name="market.send_payout", autoretry_for=(stripe_gateway.StripeError,),
             retry_backoff=True, max_retries=5)
def send_payout(payout_id: int) -> str:
    payout = Payout.objects.select_related("provider__connect_account").get(pk=payout_id)
    if payout.state != Payout.State.PENDING:
        return payout.state
    try:
        transfer_id, bank_payout_id = stripe_gateway.send_payout(payout)
    except stripe_gateway.StripeError as exc:
        if stripe_refused(exc):
            return services.payout_failed(payout_id=payout.pk, error=str(exc.user_message or exc))
        raise
    services.record_payout_ids(payout=payout, transfer_id=transfer_id, payout_id=bank_payout_id)
    return bank_payout_id


@shared_task(name="market.schedule_payouts")
def schedule_payouts() -> int:
    return len(services.schedule_payouts())


@shared_task(name="market.resend_unsent_payouts")
def resend_unsent_payouts() -> int:
    """Send again the payouts whose send_payout task was lost (beat)."""
    unsent = services.unsent_payouts(older_than_s=settings.PAYOUT_RESEND_AFTER_S)
    for payout_id in unsent:
        send_payout.delay(payout_id)
    return len(unsent)


@shared_task(name="market.start_automatic_top_ups")
def start_automatic_top_ups() -> int:
    return len(services.start_automatic_top_ups())

import pytest

from billing import services, tasks
from billing.models import Account, Entry, MoneyStateChange, SpendLimit, StripeEvent, TopUp
from tests.billing.conftest import balance, deliver, in_threads, racing
from tests.factories import client_for

Kind = Account.Kind


def top_up(client, amount="100.00", key="k-1", django_capture_on_commit_callbacks=None):
    with django_capture_on_commit_callbacks(execute=True):
        return client.post("/api/v1/account/topups/", {"amount": amount}, format="json",
                           HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def started(fake_stripe, tenant_client, django_capture_on_commit_callbacks):
    """A 100.00 top-up whose PaymentIntent exists: (top-up, payment intent id)."""
    response = top_up(tenant_client, django_capture_on_commit_callbacks=(
        django_capture_on_commit_callbacks))
    assert response.status_code == 201
    created = TopUp.objects.get(pk=response.json()["id"])
    return created, created.payment_intent_id


def test_a_top_up_creates_a_payment_intent_for_the_card_page(
        fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    response = top_up(tenant_client, "100.00",
                      django_capture_on_commit_callbacks=django_capture_on_commit_callbacks)

    assert response.status_code == 201
    assert response.json()["state"] == "created"
    (call,) = fake_stripe.calls("POST", "/v1/payment_intents")
    created = TopUp.objects.get()
    assert call["params"]["amount"] == "10000" and call["params"]["currency"] == "usd"
    assert call["params"]["metadata"] == {"ibex_top_up": str(created.pk), "ibex_org": "acme-ai"}
    assert call["idempotency_key"] == f"ibex-top-up-{created.pk}"
    body = tenant_client.get(f"/api/v1/account/topups/{created.pk}/").json()
    assert body["client_secret"].startswith(body["payment_intent_id"] + "_secret_")
    assert balance(tenant) == 0  # nothing is credited before Stripe says the card paid


def test_the_same_idempotency_key_starts_one_top_up(
        fake_stripe, tenant_client, django_capture_on_commit_callbacks):
    first = top_up(tenant_client, key="same",
                   django_capture_on_commit_callbacks=django_capture_on_commit_callbacks)
    again = top_up(tenant_client, key="same",
                   django_capture_on_commit_callbacks=django_capture_on_commit_callbacks)
    assert first.json()["id"] == again.json()["id"]
    assert len(fake_stripe.calls("POST", "/v1/payment_intents")) == 1


def test_a_retried_task_asks_stripe_for_the_same_payment_intent(started, fake_stripe):
    created, intent_id = started
    TopUp.objects.filter(pk=created.pk).update(payment_intent_id=None)

    tasks.create_payment_intent(created.pk)

    assert TopUp.objects.get(pk=created.pk).payment_intent_id == intent_id
    assert len([o for o in fake_stripe.objects.values()
                if o.get("object") == "payment_intent"]) == 1


@pytest.mark.parametrize("amount, field", [("4.99", "amount"), ("10.001", "amount"),
                                           (100.0, "amount"), ("lots", "amount")])
def test_a_bad_top_up_is_refused_naming_the_field(
        fake_stripe, tenant_client, amount, field, django_capture_on_commit_callbacks):
    response = top_up(tenant_client, amount,
                      django_capture_on_commit_callbacks=django_capture_on_commit_callbacks)
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert not TopUp.objects.exists() and not fake_stripe.requests


def test_a_provider_cannot_top_up(fake_stripe, provider, django_capture_on_commit_callbacks):
    response = top_up(client_for(provider),
                      django_capture_on_commit_callbacks=django_capture_on_commit_callbacks)
    assert response.status_code == 403 and not TopUp.objects.exists()


def test_a_paid_top_up_credits_the_tenant_once(started, fake_stripe, tenant, api_client):
    created, intent_id = started
    event = fake_stripe.succeed_payment(intent_id)

    first = deliver(api_client, event)
    second = deliver(api_client, event)

    assert first.json() == {"received": True, "duplicate": False,
                            "outcome": f"top-up {created.pk} credited"}
    assert second.json()["duplicate"] is True
    assert balance(tenant) == 100_000_000
    assert TopUp.objects.get().state == "succeeded"
    assert StripeEvent.objects.get().event_id == event["id"]
    assert list(MoneyStateChange.objects.values_list("from_state", "to_state", "actor"))[1:] == [
        ("created", "succeeded", "stripe")]


def test_a_declined_card_then_a_retry_that_succeeds_credits_once(
        started, fake_stripe, tenant, api_client):
    _, intent_id = started
    failed = fake_stripe.fail_payment(intent_id)
    succeeded = fake_stripe.succeed_payment(intent_id)

    deliver(api_client, failed)
    deliver(api_client, succeeded)

    assert TopUp.objects.get().state == "succeeded"
    assert balance(tenant) == 100_000_000


def test_a_late_failure_after_success_changes_nothing(started, fake_stripe, tenant, api_client):
    _, intent_id = started
    failed = fake_stripe.fail_payment(intent_id)
    succeeded = fake_stripe.succeed_payment(intent_id)

    deliver(api_client, succeeded)
    answer = deliver(api_client, failed).json()

    assert "already succeeded" in answer["outcome"]
    assert TopUp.objects.get().state == "succeeded"
    assert balance(tenant) == 100_000_000


def test_a_forged_delivery_is_refused_and_changes_nothing(started, fake_stripe, api_client):
    _, intent_id = started
    event = fake_stripe.succeed_payment(intent_id)

    response = deliver(api_client, event, secret="whsec_forged")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_signature"
    assert not StripeEvent.objects.exists() and Entry.objects.count() == 0


def test_a_delivery_without_a_signature_is_refused(fake_stripe, api_client):
    response = api_client.post("/api/v1/stripe/webhook/", b"{}", content_type="application/json")
    assert response.status_code == 400 and not StripeEvent.objects.exists()


def test_events_ibex_does_not_handle_are_stored_and_acknowledged(fake_stripe, api_client):
    answer = deliver(api_client, fake_stripe.event("customer.created", {"id": "cus_1"})).json()
    assert answer["outcome"] == "ignored"


@racing
def test_a_webhook_delivered_five_times_concurrently_credits_once(fake_stripe, tenant):
    from rest_framework.test import APIClient

    created = services.create_top_up(tenant=tenant, amount_micros=50_000_000)
    tasks.create_payment_intent(created.pk)
    event = fake_stripe.succeed_payment(TopUp.objects.get().payment_intent_id)

    answers = in_threads(5, lambda i: deliver(APIClient(), event).json())

    assert sorted(a["duplicate"] for a in answers) == [False, True, True, True, True]
    assert balance(tenant) == 50_000_000
    assert StripeEvent.objects.count() == 1


# --- automatic top-up ---------------------------------------------------------------------------


def test_automatic_top_up_charges_the_saved_card_when_the_balance_falls_low(
        fake_stripe, tenant, django_capture_on_commit_callbacks):
    SpendLimit.objects.create(organization=tenant, auto_top_up_below_micros=20_000_000,
                              auto_top_up_amount_micros=50_000_000,
                              stripe_customer_id="cus_RkQ2", stripe_payment_method_id="pm_card_visa")

    with django_capture_on_commit_callbacks(execute=True):
        started = tasks.start_automatic_top_ups()
    again = tasks.start_automatic_top_ups()  # one in flight: no second

    assert (started, again) == (1, 0)
    (call,) = fake_stripe.calls("POST", "/v1/payment_intents")
    assert call["params"]["confirm"] == "true" and call["params"]["off_session"] == "true"
    assert call["params"]["payment_method"] == "pm_card_visa"


def test_a_declined_automatic_top_up_fails_with_stripes_message(
        fake_stripe, tenant, django_capture_on_commit_callbacks):
    SpendLimit.objects.create(organization=tenant, auto_top_up_below_micros=20_000_000,
                              auto_top_up_amount_micros=50_000_000, stripe_customer_id="cus_RkQ2",
                              stripe_payment_method_id="pm_card_chargeDeclined")

    with django_capture_on_commit_callbacks(execute=True):
        tasks.start_automatic_top_ups()

    failed = TopUp.objects.get()
    assert failed.state == "failed"
    assert failed.last_error == "Your card has insufficient funds."
    assert balance(tenant) == 0


def test_a_payment_for_a_different_amount_is_not_credited(started, fake_stripe, tenant,
                                                          api_client):
    _, intent_id = started
    event = fake_stripe.succeed_payment(intent_id)
    event["data"]["object"]["amount_received"] = 1000

    answer = deliver(api_client, event).json()

    assert "does not match" in answer["outcome"]
    assert balance(tenant) == 0 and TopUp.objects.get().state == "created"


def test_stripe_is_not_called_when_the_transaction_that_asked_rolls_back(
        fake_stripe, tenant, django_capture_on_commit_callbacks):
    from django.db import transaction

    class Abandoned(Exception):
        pass

    with django_capture_on_commit_callbacks(execute=True) as queued:
        with pytest.raises(Abandoned), transaction.atomic():
            services.create_top_up(tenant=tenant, amount_micros=20_000_000)
            raise Abandoned

    assert queued == [] and not fake_stripe.requests and not TopUp.objects.exists()


def test_without_a_stripe_key_a_top_up_is_refused_saying_card_payments_are_off(
        tenant_client, settings):
    settings.STRIPE_API_KEY = ""

    response = tenant_client.post("/api/v1/account/topups/", {"amount": "100.00"},
                                  format="json", HTTP_IDEMPOTENCY_KEY="k-off")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "card_payments_not_configured"
    assert "operator can grant credit" in response.json()["error"]["message"]
    assert not TopUp.objects.exists()


def test_a_top_up_that_cannot_reach_stripe_fails_with_a_reason_after_its_last_try(
        fake_stripe, tenant, settings):
    settings.STRIPE_API_BASE = "http://127.0.0.1:9"  # nothing listens (discard port)
    created = services.create_top_up(tenant=tenant, amount_micros=100_000_000)

    outcome = tasks.create_payment_intent.apply(
        args=[created.pk], retries=tasks.PAYMENT_INTENT_TRIES - 1).get()

    created.refresh_from_db()
    assert outcome == "failed" and created.state == "failed"
    assert created.last_error.startswith(
        f"Stripe could not be reached after {tasks.PAYMENT_INTENT_TRIES} tries")


def test_a_top_up_that_cannot_reach_stripe_is_retried_before_its_last_try(
        fake_stripe, tenant, settings):
    from celery.exceptions import Retry

    settings.STRIPE_API_BASE = "http://127.0.0.1:9"
    created = services.create_top_up(tenant=tenant, amount_micros=100_000_000)

    with pytest.raises(Retry):
        tasks.create_payment_intent.apply(args=[created.pk], throw=True).get()

    assert TopUp.objects.get(pk=created.pk).state == "created"

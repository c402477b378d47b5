"""The whole path with a real Celery worker process: commit, then the task calls Stripe."""

import time

from billing.models import TopUp
from tests.billing.conftest import WEBHOOK_SECRET, balance, deliver, racing
from tests.factories import client_for

WAIT_S = 30


def wait_for(condition):
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the worker did not finish in time"
        time.sleep(0.1)


@racing
def test_a_top_up_reaches_stripe_from_a_worker_after_commit_and_the_webhook_credits_it(
        celery_worker_process, stripe_server, settings, tenant, api_client):
    stripe_server.fake.reset()
    settings.STRIPE_API_BASE = stripe_server.url
    settings.STRIPE_API_KEY = "sk_test_ibex"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET

    response = client_for(tenant).post("/api/v1/account/topups/", {"amount": "40.00"},
                                       format="json", HTTP_IDEMPOTENCY_KEY="first")
    top_up_id = response.json()["id"]
    wait_for(lambda: TopUp.objects.get(pk=top_up_id).client_secret)

    (call,) = stripe_server.fake.calls("POST", "/v1/payment_intents")
    assert call["idempotency_key"] == f"ibex-top-up-{top_up_id}"
    intent_id = TopUp.objects.get(pk=top_up_id).payment_intent_id
    deliver(api_client, stripe_server.fake.succeed_payment(intent_id))
    assert balance(tenant) == 40_000_000

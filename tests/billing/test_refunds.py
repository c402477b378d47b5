import pytest

from billing import services
from billing.models import Account, Entry, Refund, TopUp
from tests.billing.conftest import balance, deliver
from tests.billing.test_topups import started  # noqa: F401 - fixture

Kind = Account.Kind


@pytest.fixture
def paid(started, fake_stripe, api_client):  # noqa: F811
    created, intent_id = started
    deliver(api_client, fake_stripe.succeed_payment(intent_id))
    return created


def ask_refund(client, amount, capture, key="r-1"):
    with capture(execute=True):
        return client.post("/api/v1/account/refunds/", {"amount": amount}, format="json",
                           HTTP_IDEMPOTENCY_KEY=key)


def test_a_tenant_gets_unused_balance_back_on_the_card(
        paid, fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    response = ask_refund(tenant_client, "25.00", django_capture_on_commit_callbacks)

    assert response.status_code == 201
    refund = Refund.objects.get()
    assert refund.state == "succeeded"
    (call,) = fake_stripe.calls("POST", "/v1/refunds")
    assert call["params"]["amount"] == "2500"
    assert call["params"]["payment_intent"] == paid.payment_intent_id
    assert call["idempotency_key"] == f"ibex-refund-{refund.pk}"
    assert balance(tenant) == 75_000_000
    assert TopUp.objects.get().state == "succeeded"  # partly refunded


def test_the_charge_refunded_webhook_after_the_refund_changes_nothing(
        paid, fake_stripe, tenant, tenant_client, api_client, django_capture_on_commit_callbacks):
    ask_refund(tenant_client, "100.00", django_capture_on_commit_callbacks)
    refund = Refund.objects.get()

    answer = deliver(api_client, fake_stripe.charge_refunded(refund.stripe_refund_id)).json()

    assert "already succeeded" in answer["outcome"]
    assert balance(tenant) == 0
    assert TopUp.objects.get().state == "refunded"


def test_the_webhook_confirms_a_refund_whose_task_has_not_recorded_it(
        paid, fake_stripe, tenant, api_client):
    refund = services.request_refund(tenant=tenant, amount_micros=40_000_000)  # task not run
    stripe_refund = fake_stripe.handle(
        "POST", "/v1/refunds", {"authorization": "Bearer sk_test_ibex"},
        {"payment_intent": paid.payment_intent_id, "amount": "4000",
         "metadata": {"ibex_refund": str(refund.pk)}})[1]

    deliver(api_client, fake_stripe.charge_refunded(stripe_refund["id"]))

    assert Refund.objects.get().state == "succeeded"
    assert balance(tenant) == 60_000_000


def test_a_refund_stripe_refuses_gives_the_money_back(
        paid, fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    fake_stripe.fail_next("/v1/refunds", 400, {"error": {
        "type": "invalid_request_error", "code": "charge_disputed",
        "message": "This charge has been disputed and cannot be refunded."}})

    ask_refund(tenant_client, "25.00", django_capture_on_commit_callbacks)

    assert Refund.objects.get().state == "failed"
    assert balance(tenant) == 100_000_000
    assert TopUp.objects.get().refunded_micros == 0


def test_more_than_the_available_balance_cannot_be_refunded(
        paid, fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=90_000_000)
    entries = Entry.objects.count()

    response = ask_refund(tenant_client, "25.00", django_capture_on_commit_callbacks)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "insufficient_funds"
    assert Entry.objects.count() == entries and not Refund.objects.exists()
    assert not fake_stripe.calls("POST", "/v1/refunds")


def test_granted_credit_is_not_refundable_to_a_card(
        fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    from tests.factories import fund

    fund(tenant, "50.00")
    response = ask_refund(tenant_client, "10.00", django_capture_on_commit_callbacks)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_refundable"


def test_the_same_idempotency_key_refunds_once(
        paid, fake_stripe, tenant, tenant_client, django_capture_on_commit_callbacks):
    ask_refund(tenant_client, "10.00", django_capture_on_commit_callbacks, key="same")
    ask_refund(tenant_client, "10.00", django_capture_on_commit_callbacks, key="same")
    assert balance(tenant) == 90_000_000 and Refund.objects.count() == 1


def test_an_operator_refunds_a_top_up_from_the_admin(
        paid, fake_stripe, tenant, client, django_capture_on_commit_callbacks):
    from django.contrib.auth import get_user_model

    services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=30_000_000)
    client.force_login(get_user_model().objects.create_superuser("olga", "o@ibex.example", "pw"))

    with django_capture_on_commit_callbacks(execute=True):
        client.post("/admin/billing/topup/", {"action": "refund_unused",
                                             "_selected_action": [paid.pk]})

    refund = Refund.objects.get()
    assert (refund.amount_micros, refund.state, refund.top_up_id) == (70_000_000, "succeeded",
                                                                      paid.pk)
    assert balance(tenant) == 0 and balance(tenant, Kind.TENANT_HELD) == 30_000_000

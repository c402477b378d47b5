import pytest

from billing import services, tasks
from billing.models import Account, ConnectAccount, Payout
from tests.billing.conftest import balance, deliver
from tests.factories import client_for, fund

Kind = Account.Kind


@pytest.fixture
def onboarded(fake_stripe, provider, provider_client, api_client,
              django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        provider_client.post("/api/v1/account/connect/")
    connect = ConnectAccount.objects.get()
    deliver(api_client, fake_stripe.complete_onboarding(connect.stripe_account_id))
    return ConnectAccount.objects.get()


def earn(tenant, provider, dollars_of_usage: str):
    """The tenant pays for usage; the provider earns 85.5 % as payable."""
    from billing.core import money

    fund(tenant, "1000.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1",
                                   amount_micros=money.to_micros(dollars_of_usage))
    services.capture(hold=hold, amount_micros=hold.amount_micros, payee=provider,
                     reference="lease-1")


def test_a_provider_starts_onboarding_and_gets_a_link(
        fake_stripe, provider, provider_client, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        response = provider_client.post("/api/v1/account/connect/")

    assert response.status_code == 202
    body = provider_client.get("/api/v1/account/connect/").json()
    assert body["stripe_account_id"].startswith("acct_")
    assert body["onboarding_url"].startswith("https://connect.stripe.com/setup/e/")
    assert body["payouts_enabled"] is False
    (call,) = fake_stripe.calls("POST", "/v1/accounts")
    assert call["params"]["type"] == "express"
    assert call["idempotency_key"] == f"ibex-connect-{ConnectAccount.objects.get().pk}"


def test_a_tenant_cannot_onboard_for_payouts(fake_stripe, tenant_client):
    assert tenant_client.post("/api/v1/account/connect/").status_code == 403
    assert not ConnectAccount.objects.exists()


def test_account_updated_enables_payouts(onboarded):
    assert onboarded.details_submitted and onboarded.payouts_enabled


def test_payable_above_the_minimum_is_paid_out_keeping_the_hold_back(
        onboarded, fake_stripe, tenant, provider, django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")  # payable 85.50, held back 4.50

    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.schedule_payouts() == 1

    payout = Payout.objects.get()
    assert payout.amount_micros == 85_500_000 and payout.state == "pending"
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 0
    assert balance(provider, Kind.PROVIDER_HELD_BACK) == 4_500_000
    (transfer,) = fake_stripe.calls("POST", "/v1/transfers")
    assert transfer["params"]["destination"] == onboarded.stripe_account_id
    assert transfer["params"]["amount"] == "8550"
    (bank,) = fake_stripe.calls("POST", "/v1/payouts")
    assert bank["stripe_account"] == onboarded.stripe_account_id
    assert bank["idempotency_key"] == f"ibex-payout-{payout.pk}"


def test_payable_below_the_minimum_waits(onboarded, tenant, provider):
    earn(tenant, provider, "20.00")  # payable 17.10 < 25.00
    assert tasks.schedule_payouts() == 0 and not Payout.objects.exists()


def test_only_whole_cents_are_paid_out(onboarded, tenant, provider,
                                       django_capture_on_commit_callbacks):
    earn(tenant, provider, "40.000010")  # payable 34.200009 → 34.20 paid, 9 µ$ stay
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    assert Payout.objects.get().amount_micros == 34_200_000
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 9


def test_payout_paid_marks_it_paid_once(onboarded, fake_stripe, tenant, provider, api_client,
                                        django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    event = fake_stripe.pay_out(Payout.objects.get().stripe_payout_id)

    deliver(api_client, event)
    deliver(api_client, event)

    assert Payout.objects.get().state == "paid"
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 0


@pytest.mark.parametrize("order", [("paid", "failed"), ("failed", "paid")])
def test_a_failed_payout_returns_the_money_whatever_the_order_of_events(
        onboarded, fake_stripe, tenant, provider, api_client, order,
        django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    payout_id = Payout.objects.get().stripe_payout_id
    events = {"paid": fake_stripe.pay_out(payout_id), "failed": fake_stripe.fail_payout(payout_id)}

    for name in order:
        deliver(api_client, events[name])

    assert Payout.objects.get().state == "failed"
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 85_500_000


def test_a_transfer_stripe_refuses_fails_the_payout_and_returns_the_money(
        onboarded, fake_stripe, tenant, provider, django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    fake_stripe.objects[onboarded.stripe_account_id]["capabilities"]["transfers"] = "inactive"

    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()

    payout = Payout.objects.get()
    assert payout.state == "failed" and "capabilities" in payout.last_error
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 85_500_000


def test_a_provider_lists_its_payouts_and_a_rival_sees_none(
        onboarded, tenant, provider, django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    from tests.factories import make_org

    mine = client_for(provider).get("/api/v1/account/payouts/").json()["results"]
    rival = client_for(make_org("rival-cloud", "provider")).get("/api/v1/account/payouts/")
    assert [p["amount"] for p in mine] == ["85.50"]
    assert rival.json()["results"] == []


def test_a_payout_whose_task_was_lost_is_sent_again_once(
        onboarded, fake_stripe, tenant, provider, settings):
    earn(tenant, provider, "100.00")
    payout = services.create_payout(provider=provider)  # its send_payout task never ran
    settings.PAYOUT_RESEND_AFTER_S = 0

    assert services.unsent_payouts(older_than_s=3600) == []  # not yet overdue
    assert tasks.resend_unsent_payouts() == 1
    assert tasks.resend_unsent_payouts() == 0  # sent: nothing left to resend
    sent = Payout.objects.get(pk=payout.pk)
    assert sent.stripe_transfer_id and sent.stripe_payout_id
    assert len(fake_stripe.calls("POST", "/v1/transfers")) == 1
    assert len(fake_stripe.calls("POST", "/v1/payouts")) == 1

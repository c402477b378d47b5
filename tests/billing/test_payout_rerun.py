"""An operator re-runs a payout from the admin: a failed one pays the returned balance anew,
once; a pending one is sent again under its own Stripe idempotency key."""

import pytest
from django.contrib.auth import get_user_model

from billing import services, tasks
from billing.models import Account, Payout
from tests.billing.conftest import balance
from tests.billing.test_payouts import earn, onboarded  # noqa: F401 - a fixture

Kind = Account.Kind


@pytest.fixture
def operator_admin(client, db):
    olga = get_user_model().objects.create_superuser("olga-ops", password="a-long-passphrase-9")
    client.force_login(olga)
    return client


def rerun(client, payout):
    return client.post("/admin/billing/payout/", {"action": "rerun",
                                                 "_selected_action": [payout.pk]}, follow=True)


def test_a_failed_payout_rerun_pays_the_returned_balance_once(
        onboarded, fake_stripe, tenant, provider, operator_admin,  # noqa: F811
        django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    fake_stripe.objects[onboarded.stripe_account_id]["capabilities"]["transfers"] = "inactive"
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    failed = Payout.objects.get()
    assert failed.state == "failed"
    fake_stripe.objects[onboarded.stripe_account_id]["capabilities"]["transfers"] = "active"

    with django_capture_on_commit_callbacks(execute=True):
        page = rerun(operator_admin, failed).content.decode()
        second = rerun(operator_admin, failed).content.decode()

    fresh = Payout.objects.exclude(pk=failed.pk).get()
    assert f"payout {fresh.pk} sends 85.50 USD" in page
    assert "nothing payable to send again" in second
    assert fresh.state == "pending" and fresh.amount_micros == 85_500_000
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 0
    assert len(fake_stripe.calls("POST", "/v1/payouts")) == 1


def test_a_pending_payout_is_sent_again_under_the_same_key(
        onboarded, fake_stripe, tenant, provider, django_capture_on_commit_callbacks):  # noqa: F811
    earn(tenant, provider, "100.00")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    payout = Payout.objects.get()

    with django_capture_on_commit_callbacks(execute=True):
        done = services.rerun_payout(payout=payout, actor="olga-ops")

    assert done.action == "resent" and Payout.objects.count() == 1
    keys = {call["idempotency_key"] for call in fake_stripe.calls("POST", "/v1/transfers")}
    assert keys == {f"ibex-payout-{payout.pk}-transfer"}  # one key: Stripe makes one transfer
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 0


def test_a_paid_payout_is_not_run_again(onboarded, fake_stripe, tenant, provider, api_client,  # noqa: F811
                                        django_capture_on_commit_callbacks):
    earn(tenant, provider, "100.00")
    with django_capture_on_commit_callbacks(execute=True):
        tasks.schedule_payouts()
    payout = Payout.objects.get()
    services.payout_paid(payout_id=payout.pk)

    done = services.rerun_payout(payout=payout, actor="olga-ops")

    assert done.action == "nothing" and Payout.objects.count() == 1

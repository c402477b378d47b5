import re

import pytest

from billing import services as money
from billing.invoices import months_with_activity
from billing.models import TopUp


@pytest.fixture(autouse=True)
def card_payments(settings):
    """This exchange takes cards (a Stripe key is set; no call reaches Stripe here)."""
    settings.STRIPE_API_KEY = "sk_test_ibex"


def test_without_a_stripe_key_the_page_says_card_payments_are_off_and_refuses_a_top_up(
        tenant_web, tenant, settings):
    settings.STRIPE_API_KEY = ""

    page = tenant_web.get("/app/account/").content.decode()
    posted = tenant_web.post("/app/account/", {"amount": "100.00", "idempotency_key": "k1"})

    assert 'id="cards-off"' in page and "Card payments are not configured" in page
    assert "grant_credit --org acme-ai" in page
    assert "Start top-up" not in page
    assert posted.status_code == 400 and not TopUp.objects.exists()


def test_the_account_page_shows_balances_ledger_and_invoice_months(tenant_web, tenant):
    response = tenant_web.get("/app/account/")

    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="balance-available">$1,000.00' in page and 'id="balance-held">$0.00' in page
    assert 'id="ledger"' in page and "$1,000.00" in page  # the funding entry
    month = months_with_activity(organization=tenant)[0]
    assert f'href="/app/account/invoices/{month}/"' in page
    assert "cdn" not in page.lower() and "js.stripe.com" not in page


def test_an_invoice_month_renders_in_a_web_page(tenant_web, tenant):
    month = months_with_activity(organization=tenant)[0]

    response = tenant_web.get(f"/app/account/invoices/{month}/")

    assert response.status_code == 200
    assert f"Invoice for {month}" in response.content.decode()
    assert 'id="invoice-total"' in response.content.decode()
    assert tenant_web.get("/app/account/invoices/2026-13/").status_code == 404
    assert tenant_web.get("/app/account/invoices/junk/").status_code == 404


def test_a_top_up_polls_until_its_payment_is_ready_to_confirm(tenant_web, tenant):
    response = tenant_web.post("/app/account/", {"amount": "250.00", "idempotency_key": "t-1"})

    assert response.status_code == 302
    top_up = TopUp.objects.get(tenant=tenant)
    assert top_up.amount_micros == 250_000_000 and top_up.state == "created"
    page = tenant_web.get("/app/account/").content.decode()
    status_url = f"/app/account/top-ups/{top_up.pk}/"
    assert f'hx-get="{status_url}?try=1"' in page and 'hx-trigger="every 1s"' in page
    assert "asking Stripe for a payment" in page

    money.record_payment_intent(top_up=top_up, payment_intent_id="pi_test_123",
                                client_secret="pi_test_123_secret_abc")
    part = tenant_web.get(status_url).content.decode()

    assert "ready to confirm the card" in part and "pi_test_123" in part
    assert "every 1s" not in part  # polling stops
    assert "Stripe.js is not loaded" in part


def test_the_same_top_up_form_posted_twice_starts_one_top_up(tenant_web, tenant):
    tenant_web.post("/app/account/", {"amount": "250.00", "idempotency_key": "t-1"})
    tenant_web.post("/app/account/", {"amount": "250.00", "idempotency_key": "t-1"})

    assert TopUp.objects.filter(tenant=tenant).count() == 1


def test_a_top_up_out_of_bounds_is_refused_next_to_the_amount(tenant_web, tenant):
    response = tenant_web.post("/app/account/", {"amount": "1.00", "idempotency_key": "t-2"})

    assert response.status_code == 400
    assert 'id="id_amount_error"' in response.content.decode()
    assert "top up between" in response.content.decode()
    assert not TopUp.objects.exists()


def test_another_tenants_top_up_is_not_found(client, tenant_web, tenant):
    from ibex.accounts import services as accounts
    from tests.web.conftest import person

    top_up = money.create_top_up(tenant=tenant, amount_micros=50_000_000)
    rival = accounts.create_organization(slug="rival-labs", roles=("tenant",))
    client.force_login(person("rita-rival", rival))

    assert client.get(f"/app/account/top-ups/{top_up.pk}/").status_code == 404


def test_the_top_up_poll_gives_up_after_thirty_tries_and_says_so(tenant_web, tenant):
    from web.views_billing import POLL_TRIES

    top_up = money.create_top_up(tenant=tenant, amount_micros=50_000_000)
    status_url = f"/app/account/top-ups/{top_up.pk}/"

    still = tenant_web.get(f"{status_url}?try={POLL_TRIES - 1}").content.decode()
    last = tenant_web.get(f"{status_url}?try={POLL_TRIES}").content.decode()

    assert f'hx-get="{status_url}?try={POLL_TRIES}"' in still
    assert "hx-trigger" not in last and "Stripe has not answered yet" in last
    assert tenant_web.get(f"{status_url}?try=junk").status_code == 200


def test_the_ledger_is_paged_newest_first(tenant_web, tenant):
    from tests.factories import fund

    for i in range(30):
        fund(tenant, "1.00", reason=f"grant number {i}")

    first = tenant_web.get("/app/account/").content.decode()
    second = tenant_web.get("/app/account/?entries=2").content.decode()

    assert first.count("grant number") == 25 and "grant number 29" in first
    assert second.count("grant number") == 5 and "test funds" in second  # the oldest
    assert 'href="?entries=2#ledger-card" rel="next"' in first


def test_with_stripe_js_configured_the_page_mounts_the_card_element(tenant_web, tenant,
                                                                    settings):
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_ibex"
    settings.STRIPE_JS_URL = "https://js.stripe.com/v3/"
    tenant_web.post("/app/account/", {"amount": "250.00", "idempotency_key": "t-9"})
    top_up = TopUp.objects.get(tenant=tenant)
    money.record_payment_intent(top_up=top_up, payment_intent_id="pi_test_9",
                                client_secret="pi_test_9_secret_abc")

    page = tenant_web.get("/app/account/").content.decode()

    assert '<script src="https://js.stripe.com/v3/" defer></script>' in page
    assert '<script src="/static/web/top_up_card.js" defer></script>' in page
    assert 'data-publishable-key="pk_test_ibex"' in page
    assert 'data-client-secret="pi_test_9_secret_abc"' in page
    assert ">Pay $250.00</button>" in page


def test_without_stripe_keys_the_page_loads_nothing_from_outside(tenant_web, settings):
    settings.STRIPE_PUBLISHABLE_KEY = ""
    settings.STRIPE_JS_URL = ""

    page = tenant_web.get("/app/account/").content.decode()

    assert "js.stripe.com" not in page
    assert not [src for src in re.findall(r'<script src="([^"]+)"', page)
                if not src.startswith("/static/")]


def test_after_the_card_is_accepted_the_page_polls_until_the_webhook_credits(tenant_web,
                                                                            tenant):
    top_up = money.create_top_up(tenant=tenant, amount_micros=50_000_000)
    money.record_payment_intent(top_up=top_up, payment_intent_id="pi_test_7",
                                client_secret="pi_test_7_secret_abc")
    status_url = f"/app/account/top-ups/{top_up.pk}/"

    waiting = tenant_web.get(f"{status_url}?confirmed=1").content.decode()
    money.top_up_succeeded(top_up_id=top_up.pk, payment_intent_id="pi_test_7")
    paid = tenant_web.get(f"{status_url}?confirmed=1", HTTP_HX_REQUEST="true").content.decode()

    assert f'hx-get="{status_url}?confirmed=1&amp;try=1"' in waiting
    assert "paid" in paid and 'id="balance-available" hx-swap-oob="true">$1,050.00' in paid

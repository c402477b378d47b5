"""A provider's earnings: by month from the usage billed, hold-back, payouts with their state
(paged), and a statement per month to download."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from billing import services
from billing.models import ConnectAccount, Payout


@pytest.fixture(autouse=True)
def mid_month(time_machine):
    """The last hour's usage falls in one month, whatever the real date."""
    time_machine.move_to(datetime(2026, 11, 18, 14, 30, tzinfo=UTC), tick=True)


def bill(tenant, provider, minutes: int):
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=minutes + 1)
    for i in range(minutes):
        services.record_usage(lease_ref=f"L-1:{provider.slug}:2500000", payer=tenant,
                              payee=provider, price_per_gpu_hour_micros=2_500_000, gpus=6,
                              seconds=60, minute=start + timedelta(minutes=i))


def test_it_shows_the_month_the_balances_and_a_statement_link(provider_web, provider, tenant):
    bill(tenant, provider, minutes=60)  # 6 GPU-hours × $2.50 = $15: fee $1.50, 5 % held back

    page = provider_web.get("/provider/earnings/").content.decode()

    month = timezone.now().strftime("%Y-%m")
    assert f'<tr data-month="{month}">' in page
    assert "$15.00" in page and "$1.50" in page and "$0.68" in page  # to the cent
    assert '<div class="value" id="payable">$12.82</div>' in page  # 12.825, half to even
    assert '<div class="value" id="held-back">$0.68</div>' in page
    assert f'href="/api/v1/account/statements/{month}/?format=html" download' in page
    assert 'href="/provider/earnings/" aria-current="page">Earnings</a>' in page


def test_the_statement_link_downloads_for_the_signed_in_provider(provider_web, provider, tenant):
    bill(tenant, provider, minutes=6)
    month = timezone.now().strftime("%Y-%m")

    response = provider_web.get(f"/api/v1/account/statements/{month}/?format=html")

    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("attachment;")


def test_payouts_are_listed_newest_first_with_their_state_twenty_a_page(provider_web, provider):
    ConnectAccount.objects.create(organization=provider, stripe_account_id="acct_1",
                                  details_submitted=True, payouts_enabled=True)
    for i in range(25):
        Payout.objects.create(provider=provider, amount_micros=(30 + i) * 1_000_000,
                              state="failed" if i == 24 else "paid", last_error="card declined"
                              if i == 24 else "")

    first = provider_web.get("/provider/earnings/").content.decode()
    second = provider_web.get("/provider/earnings/?page=2").content.decode()

    assert first.count("data-payout=") == 20 and second.count("data-payout=") == 5
    assert first.index("$54.00") < first.index("$53.00")
    assert "card declined" in first and "Page 1 of 2" in first
    assert 'href="?page=2#payouts-card" rel="next"' in first
    assert '<span class="badge badge-ok">enabled</span>' in first


def test_a_tenant_is_not_shown_earnings(tenant_web):
    assert tenant_web.get("/provider/earnings/").status_code == 403

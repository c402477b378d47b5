from datetime import UTC, datetime, timedelta

import pytest

from billing import services
from tests.factories import client_for, fund

NOVEMBER = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def in_late_november(time_machine):
    """Funds, credits and usage all happen in November 2026, whatever the real date."""
    time_machine.move_to(datetime(2026, 11, 20, 12, 0, tzinfo=UTC), tick=False)


def run_lease(tenant, provider, lease_ref, minutes, gpus=8, price=2_400_000, start=NOVEMBER):
    for n in range(minutes):
        services.record_usage(lease_ref=lease_ref, payer=tenant, payee=provider,
                              price_per_gpu_hour_micros=price, seconds=60, gpus=gpus,
                              minute=start + timedelta(minutes=n))


def test_a_tenants_invoice_has_a_line_per_lease_with_gpu_hours_and_credits(
        tenant, provider, tenant_client):
    fund(tenant, "1000.00", reason="welcome")
    run_lease(tenant, provider, "lease-a", 30)  # 4 GPU-hours at 2.40 = 9.60
    # 0.5 GPU-hours at 1.00, each minute rounded to the micro-dollar: 15 × 0.033333
    run_lease(tenant, provider, "lease-b", 15, gpus=2, price=1_000_000)
    run_lease(tenant, provider, "lease-c", 5, start=NOVEMBER.replace(month=10))  # October
    services.grant_sla_credit(tenant=tenant, provider=provider, amount_micros=1_000_000,
                              lease_ref="lease-a", reason="leaf switch down 12 min")

    body = tenant_client.get("/api/v1/account/invoices/2026-11/").json()

    assert [(line["lease_ref"], line["gpu_hours"], line["price_per_gpu_hour"], line["amount"])
            for line in body["lines"]] == [("lease-a", "4.000000", "2.40", "9.60"),
                                           ("lease-b", "0.500000", "1.00", "0.499995")]
    assert [(c["cause"], c["amount"]) for c in body["credits"]][-1] == ("sla_credit", "1.00")
    assert body["usage"] == "10.099995"


def test_the_invoice_downloads_as_html(tenant, provider, tenant_client):
    fund(tenant, "100.00")
    run_lease(tenant, provider, "lease-a", 2)

    response = tenant_client.get("/api/v1/account/invoices/2026-11/?format=html")

    assert response.status_code == 200 and response["Content-Type"] == "text/html"
    assert 'filename="ibex-invoice-acme-ai-2026-11.html"' in response["Content-Disposition"]
    assert b"lease-a" in response.content and b"0.64" in response.content


def test_the_invoice_list_names_months_with_activity(tenant, provider, tenant_client):
    fund(tenant, "100.00")
    run_lease(tenant, provider, "lease-a", 1)
    months = [m["month"] for m in tenant_client.get("/api/v1/account/invoices/").json()]
    assert "2026-11" in months


def test_a_rival_tenants_invoice_shows_none_of_the_tenants_usage(tenant, rival_tenant, provider):
    fund(tenant, "100.00")
    run_lease(tenant, provider, "lease-a", 3)
    body = client_for(rival_tenant).get("/api/v1/account/invoices/2026-11/").json()
    assert body["lines"] == [] and body["total"] == "0.00"


def test_a_bad_month_is_refused_naming_it(tenant_client):
    response = tenant_client.get("/api/v1/account/invoices/november/")
    assert response.status_code == 400 and "month" in response.json()["error"]["fields"]


def test_a_providers_statement_shows_earnings_fees_and_hold_back(tenant, provider):
    fund(tenant, "100.00")
    run_lease(tenant, provider, "lease-a", 30)  # 9.60

    client = client_for(provider)
    body = client.get("/api/v1/account/statements/2026-11/").json()
    html = client.get("/api/v1/account/statements/2026-11/?format=html")

    assert (body["earnings"], body["fees"], body["held_back"], body["net"]) == (
        "9.60", "0.96", "0.432", "8.208")
    assert html.status_code == 200 and b"8.208" in html.content


def test_an_sla_credit_comes_from_the_providers_hold_back_first(tenant, provider):
    from billing.models import Account
    from tests.billing.conftest import balance

    fund(tenant, "100.00")
    run_lease(tenant, provider, "lease-a", 30)  # held back 0.432

    services.grant_sla_credit(tenant=tenant, provider=provider, amount_micros=1_000_000,
                              lease_ref="lease-a", reason="SLA broken")

    assert balance(provider, Account.Kind.PROVIDER_HELD_BACK) == 0
    assert balance(None, Account.Kind.SLA_CREDITS) == -568_000


def test_a_credit_grant_is_a_payment_not_a_credit_against_usage(tenant, provider, tenant_client):
    fund(tenant, "50000.00", reason="welcome grant")
    run_lease(tenant, provider, "lease-a", 30)  # 9.60

    body = tenant_client.get("/api/v1/account/invoices/2026-11/").json()

    assert body["credits"] == [] and body["credits_total"] == "0.00"
    assert [(p["cause"], p["amount"]) for p in body["payments"]] == [("grant", "50000.00")]
    assert body["total"] == "9.60"


def test_usage_memos_read_as_a_person_would_write_them(tenant, provider):
    from billing.models import LedgerTransaction

    fund(tenant, "100.00")
    run_lease(tenant, provider, "L-4:hpc-provider:2400000", 1)

    memo = LedgerTransaction.objects.filter(cause="usage").get().memo
    assert memo == "lease 4: 8 GPUs of hpc-provider at $2.40/GPU-hour, 2026-11-03 10:00 UTC"

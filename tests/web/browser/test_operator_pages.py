"""An operator drains a node from the admin and watches the pool on the operations dashboard;
a provider reads its earnings and payouts; a tenant registers a webhook endpoint."""

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model

from billing import services as money
from ibex.accounts.models import Organization
from pool.models import Node
from tests.web.browser.market_data import lively_market
from tests.web.browser.operations_data import (
    a_day_of_leases,
    billed_and_paid,
    deliveries_to_an_older_endpoint,
    sla_breaches,
)
from tests.web.conftest import PASSWORD, person

pytestmark = pytest.mark.django_db(transaction=True)


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def log_in(page, username):
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()


def a_tenant():
    tenant = Organization.objects.create(slug="acme-ai", name="Acme AI", is_tenant=True)
    money.grant_credit(organization=tenant, amount_micros=20_000 * 1_000_000,
                       reason="welcome credit", actor="test")
    return tenant


def test_an_operator_drains_a_node_and_sees_the_pool(page, screenshot, celery_worker_process):
    provider = lively_market()
    sla_breaches(a_day_of_leases(provider, a_tenant()))
    get_user_model().objects.create_superuser("olga", password=PASSWORD)
    node = Node.objects.filter(provider=provider).order_by("hostname").last()

    page.goto("/admin/login/?next=/admin/pool/node/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("textbox", name="Search").fill(node.hostname)
    page.get_by_role("button", name="Search").click()
    page.get_by_role("checkbox", name="Select this object for an action").first.check()
    page.get_by_role("combobox", name="Action").select_option("drain")
    page.get_by_role("button", name="Go").click()

    row = page.locator("#result_list tbody tr").filter(has_text=node.hostname)
    expect(row.locator("td.field-state")).to_have_text("Draining")
    node.refresh_from_db()
    assert node.state == "draining" and node.state_changes.last().actor == "olga"

    page.goto("/ops/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Operations")
    expect(page.locator("svg.chart-util polyline")).to_have_count(1)
    expect(page.locator("#fragmentation tbody tr")).to_have_count(3)
    expect(page.locator('tr[data-fabric="lab"] .whole-nodes')).not_to_have_text("32 / 32")
    expect(page.locator("#sla-recent li")).to_have_count(2)
    expect(page.locator("#ops-health")).to_contain_text("waiting")
    expect(page.locator("#workers")).to_contain_text("1 answering")
    screenshot(page, "operations", full_page=True)


def test_a_provider_reads_its_earnings_and_payouts(page, screenshot, time_machine):
    # the last 8 hours of usage fall in one month, so on one statement
    time_machine.move_to(datetime(2026, 11, 18, 14, 0, tzinfo=UTC), tick=True)
    provider = lively_market()
    billed_and_paid(provider, a_tenant())
    person("pat", provider)

    log_in(page, "pat")
    page.get_by_role("link", name="Earnings").click()

    expect(page).to_have_url(re.compile("/provider/earnings/$"))
    expect(page.locator("#statements tbody tr")).to_have_count(1)
    expect(page.locator("#payouts tbody tr")).to_have_count(4)
    expect(page.locator("#payouts")).to_contain_text("the bank account was closed")
    expect(page.locator("#statements").get_by_role("link", name=re.compile("Download"))
           ).to_be_visible()
    screenshot(page, "provider-earnings", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # and on a phone
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_a_tenant_registers_a_webhook_and_sees_its_secret_once(page, screenshot):
    provider = lively_market()
    tenant = a_tenant()
    deliveries_to_an_older_endpoint(a_day_of_leases(provider, tenant))
    person("tess", tenant)

    log_in(page, "tess")
    page.get_by_role("link", name="Webhooks").click()
    page.get_by_label("Endpoint URL").fill("https://hooks.acme.example/ibex")
    page.get_by_label("Description").fill("on-call pager")
    page.get_by_role("button", name="Register endpoint").click()

    expect(page.locator("#raw-secret")).to_contain_text("whsec_")
    expect(page.locator("#endpoints tbody tr")).to_have_count(2)
    expect(page.locator("#deliveries")).to_contain_text("HTTP 503")
    screenshot(page, "webhooks", full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})  # and on a phone
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.reload()
    expect(page.locator("#raw-secret")).to_have_count(0)


def test_the_operations_dashboard_fits_a_phone_screen(page):
    lively_market()
    get_user_model().objects.create_user("sam", password=PASSWORD, is_staff=True)
    page.set_viewport_size({"width": 390, "height": 844})

    log_in(page, "sam")
    page.goto("/ops/")

    expect(page.get_by_role("heading", level=1)).to_have_text("Operations")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390

"""A visitor, a tenant and a provider use IBEX in a real browser (Chromium via Playwright)."""

import re

import pytest
from django.contrib.auth import get_user_model

from billing import services as money
from ibex.accounts.models import Organization
from market.models import GpuPrice, Lease
from market.orders import OrderRequest, place_order
from tests.web.browser.market_data import lively_market, waiting_bids
from tests.web.conftest import PASSWORD, person

pytestmark = pytest.mark.django_db(transaction=True)


def expect(locator):
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


def test_a_visitor_sees_the_market_and_a_clearing_history(page, screenshot):
    lively_market()
    waiting_bids()

    page.goto("/")

    expect(page).to_have_title(re.compile("GPU market"))
    assert page.evaluate("typeof htmx") == "object"  # the vendored htmx, served by the app
    h100 = page.locator('[data-market="H100-80GB"]')
    expect(h100).to_contain_text("$2.19 – $2.45")
    expect(h100).to_contain_text("256 of 256 GPUs")
    expect(h100).to_contain_text("$2.36")
    screenshot(page, "market")
    h100.get_by_role("link", name=re.compile("Clearing history")).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("H100-80GB — clearing history")
    expect(page.locator("#clearings-table tbody tr")).to_have_count(12)
    expect(page.locator("#book-table tbody tr")).to_have_count(4)  # four limits
    screenshot(page, "clearing-history", full_page=True)


def test_the_market_fits_a_phone_screen(page):
    lively_market()
    page.set_viewport_size({"width": 390, "height": 844})

    page.goto("/")

    expect(page.locator('[data-market="H100-80GB"]')).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390


def test_a_tenant_signs_up_orders_gpus_and_sees_the_lease(page, screenshot):
    lively_market()
    page.goto("/")
    page.get_by_role("link", name="Sign up").click()
    page.get_by_label("Username").fill("tess")
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password confirmation").fill(PASSWORD)
    page.get_by_label("Organisation").fill("Acme AI")
    page.get_by_role("button", name="Sign up").click()
    expect(page).to_have_url(re.compile("/app/$"))
    tenant = Organization.objects.get(slug="acme-ai")
    money.grant_credit(organization=tenant, amount_micros=5_000 * 1_000_000,
                       reason="welcome credit", actor="test")

    page.get_by_label("GPU model", exact=True).select_option("H100-80GB")
    page.get_by_label("GPUs", exact=True).fill("16")
    page.get_by_label("Hours", exact=True).fill("4")
    page.get_by_label("Limit per GPU-hour ($)", exact=True).fill("2.50")
    page.get_by_label("Keep GPUs within").select_option("leaf")
    page.get_by_role("button", name="Place order").click()

    expect(page.locator("#order-result")).to_contain_text("filled")
    lease = Lease.objects.get(tenant=tenant)
    row = page.locator(f'tr[data-lease="{lease.pk}"]')
    expect(row.locator(".locality")).to_have_text("1 leaf · 1 spine · 2 hops")
    expect(row).to_contain_text("lab-")
    expect(page.locator("#balance-available")).not_to_have_text("$5,000.00")
    screenshot(page, "tenant-dashboard", full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())  # "End lease N now?"
    row.get_by_role("button", name=re.compile("Terminate")).click()  # htmx swaps the tables

    expect(row.locator(".badge")).to_have_text("terminated")
    expect(page.get_by_role("status").filter(has_text="terminated")).to_be_visible()


def test_an_order_refused_in_the_browser_says_why_next_to_the_field(page):
    lively_market()
    tenant = Organization.objects.create(slug="acme-ai", name="Acme AI", is_tenant=True)
    person("tess", tenant)
    page.goto("/login/")
    page.get_by_label("Username").fill("tess")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    page.get_by_label("GPUs", exact=True).fill("0")
    page.get_by_role("button", name="Place order").click()

    expect(page.locator("#id_gpus_error")).to_be_visible()
    assert not Lease.objects.exists()


def test_a_provider_sees_its_fleet_and_fabric_and_sets_a_price(page, screenshot):
    provider = lively_market()
    tenant = Organization.objects.create(slug="acme-ai", name="Acme AI", is_tenant=True)
    money.grant_credit(organization=tenant, amount_micros=10_000 * 1_000_000, reason="test",
                       actor="test")
    for gpus, level in [(16, "leaf"), (4, "node"), (8, "node"), (32, "spine")]:
        place_order(tenant=tenant, actor="test", request=OrderRequest(
            gpu_models=["H100-80GB"], gpus=gpus, hours=8, tier="on_demand",
            max_price_micros=3_000_000, topology={"required": level}))
    user = person("pat", provider)
    assert get_user_model().objects.filter(username="pat").exists()
    page.goto("/login/")
    page.get_by_label("Username").fill("pat")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()

    expect(page).to_have_url(re.compile("/provider/$"))
    expect(page.locator("#nodes tbody tr")).to_have_count(32)
    expect(page.locator("#gpus-leased")).to_have_text("60")
    expect(page.locator("svg.fabric-svg rect.node")).to_have_count(32)
    screenshot(page, "provider-fleet", full_page=True)
    expect(page.locator("svg.fabric-svg rect.n-full")).to_have_count(7)
    expect(page.locator("svg.fabric-svg rect.n-partial")).to_have_count(1)
    lease = Lease.objects.get(gpu_count=4)
    expect(page.locator("svg.fabric-svg rect.n-partial title")).to_contain_text(
        f"lease {lease.pk} (acme-ai, 4 GPUs)")

    page.get_by_label("Price", exact=True).select_option("gpu_model")
    page.get_by_label("Named").fill("H100-80GB")
    page.get_by_label("Price per GPU-hour ($)").fill("2.05")
    page.get_by_role("button", name="Set price").click()

    expect(page.get_by_role("status")).to_contain_text("256 GPUs now cost $2.05 per GPU-hour.")
    assert GpuPrice.objects.filter(superseded_at__isnull=True, gpu__node__provider=provider,
                                   price_micros=2_050_000).count() == 256
    assert user.is_active

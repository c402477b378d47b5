"""Real-browser tests: Playwright drives /usr/bin/chromium against pytest-django's live server.

Skipped, with the reason, only where /usr/bin/chromium is absent (`make browser` installs it;
CI always has it). Screenshots go to $IBEX_SCREENSHOTS when set (`docs/screenshots`), else to
the test's temporary folder.
"""

import os
from pathlib import Path

import pytest
from django.db import connections

# The one fake Stripe of the run (started, and the environment a Celery worker inherits set,
# when this is first imported): the card element's tests confirm payments on it.
from tests.billing.conftest import STRIPE_SERVER, WEBHOOK_SECRET

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync"]

def pytest_collection_modifyitems(items):
    if CHROMIUM.exists():
        return
    skip = pytest.mark.skip(reason="browser tests need /usr/bin/chromium "
                                   "(`make browser` installs it)")
    for item in items:
        if Path(__file__).parent in item.path.parents:
            item.add_marker(skip)


@pytest.fixture
def page(live_server, settings, monkeypatch):
    """A fresh Chromium page (1280×800) against the live server, cookies over plain HTTP.

    Playwright's sync API keeps an event loop running in this thread while it is started; the
    test's own database calls stay synchronous, so Django's async-safety check is told so for
    this test only (a browser per test keeps that out of every other test and subprocess)."""
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800},
                                      base_url=live_server.url)
        page = context.new_page()
        page.set_default_timeout(15_000)
        yield page
        context.close()
        browser.close()
        # the test's database calls, made while Playwright's loop ran, used connections of
        # their own (asgiref locals follow the loop's context): close them here
        connections.close_all()


@pytest.fixture
def screenshot(tmp_path):
    folder = Path(os.environ.get("IBEX_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str, full_page: bool = False):
        page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)

    return take


@pytest.fixture
def stripe_in_the_browser(live_server, settings):
    """Stripe.js from the fake Stripe (its /v3/), and the fake sending its webhooks to this
    live server, signed with the secret the app checks."""
    STRIPE_SERVER.fake.reset()
    settings.STRIPE_API_BASE = STRIPE_SERVER.url
    settings.STRIPE_API_KEY = "sk_test_ibex"
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.STRIPE_PUBLISHABLE_KEY = "pk_test_ibex"
    settings.STRIPE_JS_URL = f"{STRIPE_SERVER.url}/v3/"
    STRIPE_SERVER.fake.deliver_webhooks_to(f"{live_server.url}/api/v1/stripe/webhook/",
                                           WEBHOOK_SECRET)
    yield STRIPE_SERVER.fake
    STRIPE_SERVER.fake.deliver_webhooks_to(None, None)
    # Torn down before the test's flush (this fixture is set up after the live server's
    # transactional_db): the webhooks the test caused are handled before the tables go.
    STRIPE_SERVER.fake.wait_for_deliveries()

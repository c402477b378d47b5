"""Real-browser tests: Playwright drives /usr/bin/chromium against pytest-django's live server.

Skipped, with the reason, only where /usr/bin/chromium is absent (`make browser` installs it;
CI always has it). Screenshots go to $IBEX_SCREENSHOTS when set (`docs/screenshots`), else to
the test's temporary folder.
"""

import os
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def chromium(django_db_setup):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread while the browser runs; the
    # tests' own database calls stay synchronous, so Django's async-safety check is told so.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM),
                                                 args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(chromium, live_server, settings):
    """A fresh browser page (1280×800) against the live server, with cookies over plain HTTP."""
    settings.SESSION_COOKIE_SECURE = False
    settings.CSRF_COOKIE_SECURE = False
    context = chromium.new_context(viewport={"width": 1280, "height": 800},
                                   base_url=live_server.url)
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def screenshot(tmp_path):
    folder = Path(os.environ.get("IBEX_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str, full_page: bool = False):
        page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)

    return take

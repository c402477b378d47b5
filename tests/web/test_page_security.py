"""Security of the web pages and the API: headers, the strict Content-Security-Policy that the
templates must live with, and CSRF on every form. The URLs are walked from the URL resolver,
so a new page or form is covered without being listed here."""

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from tests.factories import client_for
from tests.web.test_lease_detail import _lease

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DIRS = [ROOT / "web" / "templates", ROOT / "market" / "templates", ROOT / "templates"]


# --- headers ------------------------------------------------------------------------------------


def _assert_security_headers(response, https: bool):
    csp = response.headers["Content-Security-Policy"]
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "script-src 'self'" in csp and "style-src 'self'" in csp
    assert "frame-ancestors 'none'" in csp
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "strict-origin-when-cross-origin"
    if https:
        hsts = response.headers["Strict-Transport-Security"]
        assert "max-age=31536000" in hsts and "includeSubDomains" in hsts


@pytest.mark.parametrize("https", [True, False])
def test_a_page_carries_the_security_headers(client, db, https):
    response = client.get("/", secure=https)

    assert response.status_code == 200
    _assert_security_headers(response, https)
    assert ("Strict-Transport-Security" in response.headers) == https  # HSTS only over HTTPS


def test_the_api_carries_the_security_headers(tenant):
    response = client_for(tenant, scopes=("read",)).get("/api/v1/leases/", secure=True)

    assert response.status_code == 200
    _assert_security_headers(response, https=True)


def test_an_api_error_carries_them_too(client, db):
    _assert_security_headers(client.get("/api/v1/leases/", secure=True), https=True)


def test_hsts_is_on_by_default_in_production_settings():
    assert not settings.DEBUG
    assert settings.SECURE_HSTS_SECONDS >= 31_536_000 and settings.SECURE_HSTS_INCLUDE_SUBDOMAINS


# --- no inline scripts, styles or handlers (the CSP would block them) --------------------------


class _InlineFinder(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        for name, _ in attrs:
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
        if tag == "style":
            self.found.append("<style> block")
        if tag == "script" and "src" not in names and names.get("type") != "application/json":
            self._in_script = True

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.found.append(f"inline <script>: {data.strip()[:40]}")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False


def _inline_code(html: str) -> list[str]:
    finder = _InlineFinder()
    finder.feed(html)
    return finder.found


def _web_paths(resolver=None, prefix="") -> list[tuple[str, str]]:
    """(route, name) of every web page, from the resolver (admin and API left to their tests)."""
    resolver = resolver or get_resolver()
    found = []
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            if route.startswith(("api/", "admin/")):
                continue
            found.extend(_web_paths(entry, route))
        elif isinstance(entry, URLPattern) and route not in ("healthz", "readyz"):
            found.append((route, entry.name))
    return found


def _url(route: str, ids: dict) -> str:
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: str(ids.get(m.group(1), "1")), route)


def test_no_template_has_inline_scripts_styles_or_handlers():
    found = []
    for folder in TEMPLATE_DIRS:
        for path in folder.rglob("*.html"):
            text = re.sub(r"{%.*?%}|{{.*?}}", "x", path.read_text(), flags=re.S)
            found += [f"{path.relative_to(ROOT)}: {what}" for what in _inline_code(text)]
    assert found == []


def test_every_page_renders_without_inline_code(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)
    ids = {"lease_id": lease.pk, "gpu_model": "H100-80GB", "month": "2026-11"}
    checked = 0
    for route, name in _web_paths():
        if name == "logout":
            continue
        response = tenant_web.get(_url(route, ids))
        if response.status_code != 200 or "html" not in response.headers["Content-Type"]:
            continue
        assert _inline_code(response.content.decode()) == [], route
        checked += 1
    assert checked >= 8


def test_the_api_docs_page_has_no_inline_code(tenant_web):
    response = tenant_web.get("/api/v1/docs/")

    assert response.status_code == 200
    assert _inline_code(response.content.decode()) == []


# --- CSRF ---------------------------------------------------------------------------------------


def test_every_web_form_refuses_a_post_without_the_csrf_token(tenant_person, tenant, provider):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(tenant_person)
    routes = _web_paths()

    answers = {route: browser.post(_url(route, {}), {"x": "1"}).status_code
               for route, _ in routes}

    assert routes and all(code == 403 for code in answers.values()), answers


def test_the_log_in_and_sign_up_forms_refuse_a_post_without_the_token(db):
    browser = Client(enforce_csrf_checks=True)
    assert browser.post("/login/", {"username": "a", "password": "b"}).status_code == 403
    assert browser.post("/signup/", {"username": "a"}).status_code == 403


def test_a_session_caller_of_the_api_needs_the_csrf_token(tenant_person, tenant):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(tenant_person)

    response = browser.post("/api/v1/webhooks/", {"url": "https://acme.example/hook"},
                            content_type="application/json")

    assert response.status_code == 403
    assert "CSRF" in response.content.decode()


def test_every_post_form_in_the_templates_carries_the_token():
    missing = []
    for folder in TEMPLATE_DIRS:
        for path in folder.rglob("*.html"):
            for form in re.findall(r"<form\b[^>]*>.*?</form>", path.read_text(), flags=re.S | re.I):
                if re.search(r'method="post"', form, re.I) and "{% csrf_token %}" not in form:
                    missing.append(f"{path.relative_to(ROOT)}: {form[:60]}")
    assert missing == []


def test_stripe_js_is_allowed_only_from_stripe_and_only_where_configured(client, db, settings):
    settings.STRIPE_JS_URL = ""
    closed = client.get("/").headers["Content-Security-Policy"]
    settings.STRIPE_JS_URL = "https://js.stripe.com/v3/"
    open_ = client.get("/").headers["Content-Security-Policy"]

    assert "stripe" not in closed and "frame-src 'none'" in closed
    assert "script-src 'self' https://js.stripe.com;" in open_
    assert "frame-src 'self' https://js.stripe.com https://hooks.stripe.com" in open_
    assert "connect-src 'self' https://js.stripe.com https://api.stripe.com" in open_
    assert "unsafe-inline" not in open_

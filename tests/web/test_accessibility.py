"""Every page has a title, a skip link to its main content, and a label for every input."""

import re

import pytest

PAGES = {"/": "client", "/signup/": "client", "/login/": "client",
         "/markets/H100-80GB/": "client", "/app/": "tenant_web", "/app/keys/": "tenant_web",
         "/provider/": "provider_web"}


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

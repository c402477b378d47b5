"""People get HTML error pages with the site's look; programs under /api/ keep JSON."""

import pytest
from django.test import Client

from web import errors


def test_an_unknown_page_is_an_html_404_with_a_title(client, db):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
    page = response.content.decode()
    assert "<title>Page not found · IBEX GPU exchange</title>" in page
    assert '<p class="code">404</p>' in page and 'class="skip-link"' in page


def test_an_unknown_api_path_stays_json(client, db):
    response = client.get("/api/v1/no-such-thing/")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(("path", "kind"), [("/app/x", "text/html"),
                                            ("/api/v1/x", "application/json")])
def test_a_server_error_answers_in_the_callers_language(rf, path, kind):
    response = errors.server_error(rf.get(path))

    assert response.status_code == 500 and response["Content-Type"].startswith(kind)


def test_a_403_page_for_people(rf, db):
    from django.contrib.auth.models import AnonymousUser

    request = rf.get("/app/")
    request.user = AnonymousUser()
    response = errors.permission_denied(request)

    assert response.status_code == 403 and b"Not allowed" in response.content


def test_a_view_that_crashes_gets_the_html_500(db, settings):
    from django.urls import include, path

    def boom(request):
        raise RuntimeError("boom")

    settings.ROOT_URLCONF = type("urls", (), {
        "urlpatterns": [path("boom/", boom), path("", include("web.urls"))], "handler500": "web.errors.server_error"})
    response = Client(raise_request_exception=False).get("/boom/")

    assert response.status_code == 500
    assert b"Something went wrong" in response.content

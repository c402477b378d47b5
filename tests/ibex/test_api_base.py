import json
from pathlib import Path

import pytest
from django.core.management import call_command
from rest_framework import exceptions

from ibex.accounts import services
from ibex.api.errors import exception_handler

pytestmark = pytest.mark.django_db


def test_the_openapi_schema_generates_valid_with_no_warnings(tmp_path):
    schema = tmp_path / "schema.yaml"

    # --fail-on-warn turns every drf-spectacular warning into a failure
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(schema))

    text = schema.read_text()
    assert text.startswith("openapi: 3")
    assert "/api/v1/me/" in text


def test_every_operation_documents_its_error_shape(client):
    # Found by the API fuzzer (2026-11-30): 400/401/403/404 answers were undocumented.
    schema = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()

    operations = [op for item in schema["paths"].values() for op in item.values()]
    assert operations
    for operation in operations:
        assert operation["responses"]["4XX"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"}
    assert schema["components"]["schemas"]["Error"]["required"] == ["error"]


def test_a_host_not_allowed_is_refused_in_the_error_shape(client):
    # Found by the API fuzzer (2026-11-30): Django's own 400 was an HTML page.
    response = client.get("/api/v1/me/", HTTP_HOST="vbRiq{")

    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "bad_request"


def test_the_schema_is_served_as_openapi_3(client):
    response = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json")

    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")


def test_the_docs_page_loads_swagger_from_our_own_static_files(client):
    response = client.get("/api/v1/docs/")

    html = response.content.decode()
    assert response.status_code == 200
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower()


def test_the_api_root_links_schema_docs_and_health(client):
    response = client.get("/api/v1/")

    links = response.json()["links"]
    assert response.status_code == 200
    assert links["schema"].endswith("/api/v1/schema/")
    assert links["docs"].endswith("/api/v1/docs/")
    assert links["ready"].endswith("/readyz")


def test_an_unknown_api_path_answers_404_in_the_error_shape(client):
    response = client.get("/api/v1/no-such-thing/")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_request_without_credentials_is_refused_in_the_error_shape(api_client):
    response = api_client.get("/api/v1/me/")

    assert response.status_code == 401
    assert response.json() == {"error": {
        "code": "not_authenticated",
        "message": "Authentication credentials were not provided.",
        "fields": {},
    }}
    assert response["WWW-Authenticate"] == "Bearer"


def test_a_bearer_key_authenticates_as_its_organisation(tenant_client, tenant_key):
    response = tenant_client.get("/api/v1/me/")

    assert response.status_code == 200
    assert response.json() == {
        "username": "acme-ai-service",
        "organizations": ["acme-ai"],
        "api_key": tenant_key.api_key.prefix,
        "scopes": ["read", "trade"],
    }


def test_a_key_is_stored_only_as_a_hash(tenant_key):
    tenant_key.api_key.refresh_from_db()

    assert tenant_key.raw_key not in tenant_key.api_key.key_hash
    assert tenant_key.api_key.key_hash == services.hash_key(tenant_key.raw_key)


@pytest.mark.parametrize("header", ["Bearer ibex_nope_nope", "Bearer not-a-key"])
def test_an_unknown_or_malformed_key_is_refused(api_client, header):
    response = api_client.get("/api/v1/me/", HTTP_AUTHORIZATION=header)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"


def test_a_revoked_key_is_refused(api_client, tenant_key):
    services.revoke_api_key(api_key=tenant_key.api_key)

    response = api_client.get("/api/v1/me/", HTTP_AUTHORIZATION=f"Bearer {tenant_key.raw_key}")

    assert response.status_code == 401
    assert response.json()["error"]["message"] == "This API key has been revoked."


def test_validation_errors_name_each_field():
    exc = exceptions.ValidationError({"count": ["Must be positive."], "scope": {"leaf": ["Unknown."]}})

    response = exception_handler(exc, {})

    assert response.status_code == 400
    assert response.data == {"error": {
        "code": "invalid",
        "message": "Invalid input.",
        "fields": {"count": ["Must be positive."], "scope.leaf": ["Unknown."]},
    }}


def test_list_endpoints_default_to_cursor_pagination_and_throttling_is_on(settings):
    framework = settings.REST_FRAMEWORK

    assert framework["DEFAULT_PAGINATION_CLASS"] == "ibex.api.pagination.CursorPagination"
    assert set(framework["DEFAULT_THROTTLE_RATES"]) == {"anon", "user", "orders", "keys", "heartbeat",
                                                         "node_logs"}


def test_the_api_root_links_every_resource_collection(api_client):
    links = api_client.get("/api/v1/").json()["links"]

    for resource in ("orders", "leases", "nodes", "fabrics", "prices", "webhooks", "events",
                     "markets", "account/topups", "gpus"):
        assert links[resource] == f"http://testserver/api/v1/{resource}/"
    assert len(links) >= 20
    assert api_client.get(links["markets"]).status_code == 200


def test_the_schema_is_the_committed_contract(client):
    # Restructuring must not change the API: tests/ibex/data/openapi.json is the contract.
    # A deliberate API change regenerates it (see docs/architecture.md, "The API contract").
    committed = json.loads((Path(__file__).parent / "data" / "openapi.json").read_text())

    served = client.get("/api/v1/schema/", HTTP_ACCEPT="application/json").json()

    assert served == committed

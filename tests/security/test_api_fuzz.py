"""Fuzz every REST operation from the OpenAPI schema with schemathesis.

Each operation is called as a tenant, a provider (with a fabric and a registered node) and an
operator. A response must never be a 5xx and must match the schema: status code, content type
and body. Every example runs in a savepoint that is rolled back, so one example's writes
(a deleted fabric, a rotated token) do not change what the next one sees.

Bounded for the suite (FUZZ_EXAMPLES per operation and persona); a long campaign:
    IBEX_FUZZ_EXAMPLES=300 IBEX_FUZZ_COVERAGE=1 pytest -rxX tests/security/test_api_fuzz.py
"""

import functools
import os

import hypothesis
import pytest
import schemathesis
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections, transaction
from drf_spectacular.generators import SchemaGenerator
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts.models import ApiKey
from ibex.accounts.services import issue_api_key
from tests.factories import client_for, make_org
from tests.pool.conftest import node_body

FUZZ_EXAMPLES = int(os.environ.get("IBEX_FUZZ_EXAMPLES", "12"))
# The coverage phase (boundary values of every parameter) is slow on two cores: campaigns only.
COVERAGE = os.environ.get("IBEX_FUZZ_COVERAGE") == "1"
CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          content_type_conformance]

# The schema drf-spectacular serves at /api/v1/schema/, generated without a request.
schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))


@functools.cache
def _django():
    # Built on first call, after the session fixtures have turned the HTTPS redirect off.
    return WSGIHandler()


def application(environ, start_response):
    return _django()(environ, start_response)


schema.app = application
schema.config.phases.coverage.enabled = COVERAGE
# Left out: the schema and Swagger UI pages describe the API rather than being part of it; the
# Stripe webhook takes only bodies signed with the endpoint secret, so generated bodies would
# all stop at the signature check (its own tests send signed events).
schema = schema.exclude(path_regex=r"^/api/v1/(schema/|docs/|stripe/webhook/)$")

@pytest.fixture
def world(db):
    """Three personas and something for each endpoint to find: {persona: headers}, ids."""
    tenant = make_org("fuzz-tenant", "tenant")
    provider = make_org("fuzz-provider", "provider")
    operator = make_org("fuzz-operator", "operator")
    fabric = fabric_services.save_fabric(owner=provider, name="lab",
                                         spec=generators.fat_tree(8, 8), source="generator")
    every_scope = list(ApiKey.Scope.values)  # "admin" too, or key management is only a 403
    keys = {name: issue_api_key(organization=org, scopes=every_scope)
            for name, org in (("tenant", tenant), ("provider", provider), ("operator", operator))}
    node = client_for(provider).post("/api/v1/nodes/", node_body(), format="json").json()
    # Django closes the connection at the start and end of a request when it is inside a
    # transaction; the test client (used just above, and it reconnects them after its
    # request) stops that, and so must this in-process caller that is not the test client.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield {
        "headers": {name: {"Authorization": f"Bearer {key.raw_key}"} for name, key in keys.items()},
        "ids": {"fabrics": fabric.fabric.pk, "nodes": node["id"]},
        "keys": {name: key.api_key.pk for name, key in keys.items()},
        "node_token": node["token"],
    }
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


def _aim_at_real_rows(case, persona, world) -> None:
    """Half of the generated ids are replaced by ids that exist, so that detail, drain and
    heartbeat operations are reached beyond their 404."""
    identifier = (case.path_parameters or {}).get("id")
    collection = case.operation.path.split("/")[3]
    real = world["keys"][persona] if collection == "keys" else world["ids"].get(collection)
    if real is not None and isinstance(identifier, int) and identifier % 2 == 0:
        case.path_parameters["id"] = real


@pytest.mark.parametrize("persona", ["tenant", "provider", "operator"])
@schema.parametrize()
@hypothesis.settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
def test_api(case, persona, world):
    _aim_at_real_rows(case, persona, world)
    headers = dict(world["headers"][persona])
    if case.operation.path.endswith("/heartbeat/"):
        # A node agent's endpoint: it takes the node's token, not an API key.
        headers = {"Authorization": f"Node {world['node_token']}"}
    with transaction.atomic():
        try:
            case.call_and_validate(headers=headers, checks=CHECKS)
        finally:
            transaction.set_rollback(True)

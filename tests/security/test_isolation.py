"""Isolation, generated from the API itself: every route is visited, none is listed by hand.

The OpenAPI schema (the one served at /api/v1/schema/) names every operation. Two mirror-image
worlds, "alpha" and "beta", each hold a provider (fabric, node, GPUs, a pool) and a tenant (an
order, a lease, an event, a top-up, a webhook endpoint, a spare API key). Then:

- every operation whose path names an object is called with the *other* world's key, holding
  every scope, and must answer 404 (never 200, never 403, which would confirm the object);
  the owner's own key reads the same object (so the 404 is about ownership, not a bad id);
- every write operation (POST, PUT, PATCH, DELETE) is called with a key that lacks the scope it
  needs and must answer 403, and leave nothing changed.

A new endpoint is covered the day it is added: a path parameter this file cannot resolve to an
owned object, or a write whose scope it cannot tell, fails the test until it is classified.
"""

from datetime import timedelta

import pytest
from django.urls import resolve
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from billing import services as market
from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts import services as accounts
from ibex.accounts.models import ApiKey
from ibex.accounts.permissions import ALL_SCOPES, _ScopePermission
from market import leasing
from market.orders import OrderRequest, place_order
from notify import events, webhooks
from pool import services as pool
from pool.models import Gpu, Pool
from tests.factories import fund, make_org

SCHEMA = SchemaGenerator().get_schema(request=None, public=True)
WRITES = ("post", "put", "patch", "delete")
OPERATIONS = sorted((path, method) for path, item in SCHEMA["paths"].items()
                    for method in item if method in ("get", *WRITES))

# Paths whose parameter is not an object owned by someone: public catalogue entries and the
# caller's own account months (the month only picks a period of the caller's own account).
PUBLIC_OR_SELF = {
    "/api/v1/gpu-models/{name}/": "the public GPU catalogue",
    "/api/v1/markets/{gpu_model}/history/": "public market prices",
    "/api/v1/markets/{gpu_model}/book/": "public market data, naming no bidder",
    "/api/v1/markets/{gpu_model}/candles/": "public market prices",
    "/api/v1/account/invoices/{month}/": "a month of the caller's own account",
    "/api/v1/account/statements/{month}/": "a month of the caller's own account",
}
# Operations that no API key authorises, by design; their own tests cover their credentials.
NOT_KEYED = {
    ("/api/v1/nodes/{id}/heartbeat/", "post"): "a node agent's token (tests/pool/test_heartbeat)",
    ("/api/v1/nodes/{id}/logs/", "post"): "a node agent's token (tests/pool/test_workloads)",
    ("/api/v1/stripe/webhook/", "post"): "Stripe's signature (tests/market/test_webhooks)",
    ("/api/v1/orgs/", "post"): "sign-up, open to anyone (throttled)",
}
# Writes whose view checks its scope itself rather than through a permission class.
SCOPE_CHECKED_IN_VIEW = {"/api/v1/keys/": "admin", "/api/v1/keys/{id}/": "admin"}


def _collection(path: str) -> str:
    return path.removeprefix("/api/v1/").split("/")[0]


def _world(name: str) -> dict:
    """A provider and a tenant with one of everything; {owner persona, object ids, keys}."""
    provider = make_org(f"{name}-cloud", "provider")
    accounts.change_provider_state(organization=provider, to_state="verified", actor="test",
                                   reason="audit")
    tenant = make_org(f"{name}-labs", "tenant")
    spec = generators.fat_tree(2, 4, tiers=2, prefix=f"{name}-")
    fabric = fabric_services.save_fabric(owner=provider, name=f"{name}-lab", spec=spec,
                                         source="generator").fabric
    node = pool.register_nodes(provider=provider, specs=[
        pool.NodeSpec(hostname=host, fabric=fabric.name, gpu_model="H100-80GB", gpu_count=8,
                      cpu_cores=64, memory_gib=1024) for host in spec.hosts])[0].node
    private_pool = Pool.objects.create(name=f"{name}-pool", owner=provider)
    gpus = list(Gpu.objects.filter(node=node).order_by("index")[:2])
    fund(tenant, "500")
    start = timezone.now()
    lease = leasing.create_lease(
        tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
        gpus=[leasing.GpuChoice(g.pk, 2_000_000) for g in gpus], starts_at=start,
        ends_at=start + timedelta(hours=2), price_micros=2_000_000, max_price_micros=2_500_000,
        locality={"leaves": 1, "spines": 1, "max_hops": 0}, actor="test")
    order = place_order(tenant=tenant, request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=1, hours=1, tier="spot", max_price_micros=1_000_000,
        fill="rest"),
        actor="test")
    event = events.record_event(lease=lease, kind="lease.started", source=f"test:{name}",
                                occurred_at=start, payload={})
    endpoint = webhooks.create_endpoint(tenant=tenant, url=f"https://{name}.example/hook")
    top_up = market.create_top_up(tenant=tenant, amount_micros=10_000_000)
    full = list(ALL_SCOPES)
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=full)
    provider_key = accounts.issue_api_key(organization=provider, scopes=full)
    spare_key = accounts.issue_api_key(organization=tenant, scopes=["read"], name="spare")
    owned = {
        "account": ("tenant", top_up.pk), "events": ("tenant", event.pk),
        "fabrics": ("provider", fabric.pk), "gpus": ("provider", gpus[0].pk),
        "keys": ("tenant", spare_key.api_key.pk), "leases": ("tenant", lease.pk),
        "nodes": ("provider", node.pk), "orders": ("tenant", order.pk),
        "pools": ("provider", private_pool.name), "webhooks": ("tenant", endpoint.pk),
    }
    return {"orgs": {"tenant": tenant, "provider": provider}, "owned": owned,
            "keys": {"tenant": tenant_key.raw_key, "provider": provider_key.raw_key}}


@pytest.fixture
def worlds(db, settings):
    settings.STRIPE_API_KEY = "sk_test_ibex"  # the worlds hold a top-up each
    pool.ensure_gpu_catalogue()
    return {"alpha": _world("alpha"), "beta": _world("beta")}


def _client(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def _call(client, method, url):
    return getattr(client, method)(url, {}, format="json")


OBJECT_OPERATIONS = [(p, m) for p, m in OPERATIONS if "{" in p and (p, m) not in NOT_KEYED]


@pytest.mark.parametrize(("path", "method"), OBJECT_OPERATIONS,
                         ids=[f"{m.upper()} {p}" for p, m in OBJECT_OPERATIONS])
def test_another_organisations_object_is_a_404(worlds, path, method):
    if path in PUBLIC_OR_SELF:
        return  # nothing owned to leak; listed above with the reason
    collection = _collection(path)
    assert collection in worlds["alpha"]["owned"], (
        f"{path} names an object this test cannot find an owner for: add it to _world()")
    persona, object_id = worlds["alpha"]["owned"][collection]
    url = path.replace(path[path.index("{"):path.index("}") + 1], str(object_id))

    rival = _call(_client(worlds["beta"]["keys"][persona]), method, url)
    assert rival.status_code == 404, (rival.status_code, rival.content[:300])

    # The owner reads the object (the operation itself for a read, the object for a write).
    own_url = url if method == "get" else "/".join(url.split("/")[:5]) + "/"
    owner = _client(worlds["alpha"]["keys"][persona]).get(own_url)
    assert owner.status_code == 200, (url, owner.status_code, owner.content[:300])


def _needed_scope(path: str, method: str) -> str:
    """The scope a write needs, read from the view's permission classes."""
    if path in SCOPE_CHECKED_IN_VIEW:
        return SCOPE_CHECKED_IN_VIEW[path]
    url = path.replace("{id}", "1").replace("{name}", "x")
    view = resolve(url).func
    cls = getattr(view, "cls", None)
    scopes = {p.scope for p in getattr(cls, "permission_classes", ())
              if isinstance(p, type) and issubclass(p, _ScopePermission)}
    assert len(scopes) == 1, f"{method.upper()} {path}: cannot tell which scope it needs"
    return scopes.pop()


WRITE_OPERATIONS = [(p, m) for p, m in OPERATIONS if m in WRITES and (p, m) not in NOT_KEYED]


@pytest.mark.parametrize(("path", "method"), WRITE_OPERATIONS,
                         ids=[f"{m.upper()} {p}" for p, m in WRITE_OPERATIONS])
@pytest.mark.parametrize("persona", ["tenant", "provider"])
def test_a_write_with_too_few_scopes_is_a_403(worlds, path, method, persona):
    needed = _needed_scope(path, method)
    world = worlds["alpha"]
    lacking = sorted(ALL_SCOPES - {needed, "admin"})  # every other scope, even `read`
    key = accounts.issue_api_key(organization=world["orgs"][persona], scopes=lacking)
    url = path
    if "{" in path:
        _, object_id = world["owned"].get(_collection(path), (None, 1))
        url = path.replace(path[path.index("{"):path.index("}") + 1], str(object_id))
    keys_before = ApiKey.objects.count()

    response = _call(_client(key.raw_key), method, url)

    assert response.status_code == 403, (response.status_code, response.content[:300])
    assert ApiKey.objects.count() == keys_before


def test_every_operation_is_classified():
    """The tables above name only operations that exist (no stale exemptions)."""
    paths = {p for p, _ in OPERATIONS}
    assert set(PUBLIC_OR_SELF) <= paths
    assert set(NOT_KEYED) <= set(OPERATIONS)
    assert len(OBJECT_OPERATIONS) >= 20 and len(WRITE_OPERATIONS) >= 20

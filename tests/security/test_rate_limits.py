"""Rate limits: the request after the limit is refused with 429, and what it would have done is
not done (no order, no key). Limits are lowered in each test; the counters live in Redis, under
a prefix of this test's own so runs do not see each other's counts."""

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import caches
from django.test import Client

from ibex.accounts import services as accounts
from ibex.accounts.models import ApiKey
from market.models import Order
from tests.factories import client_for, fund, make_org
from tests.market.inventory import provider_with_nodes
from tests.pool.conftest import heartbeat, node_body

ORDER = {"gpu_models": ["H100-80GB"], "gpus": 1, "hours": 1, "tier": "spot", "fill": "rest",
         "max_price_per_gpu_hour": "1.00"}


@pytest.fixture(autouse=True)
def own_counters(monkeypatch):
    monkeypatch.setattr(caches["default"], "key_prefix", f"ibex-test-{uuid.uuid4().hex}")


@pytest.fixture
def rates(settings):
    def lower(**rates):
        settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
            **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], **rates}}
        settings.IBEX_RATE_LIMITS = {**settings.IBEX_RATE_LIMITS, **rates}
    return lower


def test_the_order_after_the_limit_is_a_429_and_is_not_placed(rates, db):
    rates(orders="3/min")
    provider_with_nodes(nodes=2)
    tenant = make_org("acme-ai", "tenant")
    fund(tenant, "100")
    client = client_for(tenant, scopes=("read", "trade"))

    answers = [client.post("/api/v1/orders/", ORDER, format="json").status_code for _ in range(4)]

    assert answers == [201, 201, 201, 429]
    assert Order.objects.filter(tenant=tenant).count() == 3
    # The limit is the organisation's, whichever key it uses; reads are not counted.
    other_key = client_for(tenant, scopes=("read", "trade"))
    assert other_key.post("/api/v1/orders/", ORDER, format="json").status_code == 429
    assert other_key.get("/api/v1/orders/").status_code == 200
    # Another organisation has its own allowance.
    rival = make_org("rival-labs", "tenant")
    fund(rival, "100")
    assert client_for(rival).post("/api/v1/orders/", ORDER, format="json").status_code == 201


def test_the_key_created_after_the_limit_is_a_429_and_no_key_exists(rates, db):
    rates(keys="2/hour")
    tenant = make_org("acme-ai", "tenant")
    client = client_for(tenant, scopes=("read", "trade", "admin"))
    before = ApiKey.objects.count()

    answers = [client.post("/api/v1/keys/", {"scopes": ["read"]}, format="json").status_code
               for _ in range(3)]

    assert answers == [201, 201, 429]
    assert ApiKey.objects.count() == before + 2


def test_a_key_created_on_the_web_after_the_limit_is_a_429(rates, db):
    rates(keys="1/hour")
    user = get_user_model().objects.create_user("alice", password="correct horse battery")
    tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",), owner=user)
    browser = Client()
    browser.force_login(user)
    form = {"name": "ci", "scopes": ["read"]}

    answers = [browser.post("/app/keys/", form).status_code for _ in range(2)]

    assert answers == [200, 429]
    assert ApiKey.objects.filter(organization=tenant, name="ci").count() == 1


def test_heartbeats_faster_than_the_limit_are_a_429_and_strangers_use_none_of_it(
        rates, db):
    from fabric import services as fabric_services
    from fabric.core import generators
    from pool import services as pool

    rates(heartbeat="2/min")
    provider = make_org("hpc-provider", "provider")
    pool.ensure_gpu_catalogue()
    fabric_services.save_fabric(owner=provider, name="lab", source="generator",
                                spec=generators.fat_tree(8, 8, tiers=2))
    body = client_for(provider).post("/api/v1/nodes/", node_body(), format="json").json()
    for _ in range(5):  # a stranger with a wrong token: refused, and counts nothing
        assert heartbeat(body["id"], "ibexnode_bad_token").status_code == 401

    answers = [heartbeat(body["id"], body["token"]).status_code for _ in range(3)]

    assert answers == [200, 200, 429]


def test_failed_log_ins_past_the_limit_are_a_429_even_with_the_right_password(rates, db):
    rates(login="3/5m")
    name = f"alice-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_user(name, password="correct horse battery")
    browser = Client()

    wrong = [browser.post("/login/", {"username": name, "password": "guess"}).status_code
             for _ in range(3)]
    right = browser.post("/login/", {"username": name, "password": "correct horse battery"})

    assert wrong == [200, 200, 200]
    assert right.status_code == 429
    assert b"Too many failed log-in attempts" in right.content
    assert "_auth_user_id" not in browser.session
    # Someone else logging in from elsewhere is not affected.
    other = f"bob-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_user(other, password="correct horse battery")
    assert Client().post("/login/", {"username": other, "password": "correct horse battery"}
                         ).status_code == 302


def test_an_order_placed_on_the_web_after_the_limit_is_a_429_and_is_not_placed(rates, db):
    rates(orders="2/min")
    provider_with_nodes(nodes=2)
    user = get_user_model().objects.create_user("bob", password="correct horse battery")
    tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",), owner=user)
    fund(tenant, "1000")
    browser = Client()
    browser.force_login(user)
    form = {"gpu_model": "H100-80GB", "gpus": "1", "hours": "1", "tier": "spot", "fill": "rest",
            "max_price": "1.00", "level": "node", "strict": "required"}

    answers = [browser.post("/app/", {**form, "idempotency_key": f"k-{n}"}).status_code
               for n in range(3)]

    assert answers == [302, 302, 429]
    assert Order.objects.filter(tenant=tenant).count() == 2

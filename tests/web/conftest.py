"""Personas for the web pages: a tenant person, a provider person with a small priced fleet."""

import pytest
from django.contrib.auth import get_user_model

from ibex.accounts import services as accounts
from market import prices
from pool.models import Node
from tests.factories import fund
from tests.market.inventory import provider_with_nodes

PASSWORD = "a-long-test-passphrase-42"


def person(username: str, org):
    user = get_user_model().objects.create_user(username=username, password=PASSWORD)
    from ibex.accounts.models import Membership

    Membership.objects.create(user=user, organization=org, role=Membership.Role.OWNER)
    return user


@pytest.fixture
def provider(db):
    """A verified provider with 4 active nodes of 8 H100s (2 leaves) at $2.50."""
    org = provider_with_nodes(nodes=4)
    Node.objects.filter(provider=org).update(state="active")
    prices.set_prices(provider=org, scope={"fabric": "lab"}, price_micros=2_500_000,
                      actor="test")
    return org


@pytest.fixture
def provider_person(provider):
    return person("pat-provider", provider)


@pytest.fixture
def tenant(db):
    org = accounts.create_organization(slug="acme-ai", name="Acme AI", roles=("tenant",))
    fund(org, "1000.00")
    return org


@pytest.fixture
def tenant_person(tenant):
    return person("tess-tenant", tenant)


@pytest.fixture
def tenant_web(client, tenant_person):
    client.force_login(tenant_person)
    return client


@pytest.fixture
def provider_web(client, provider_person):
    client.force_login(provider_person)
    return client


@pytest.fixture
def operator_web(client, db):
    """A person of the installation's operator organisation, signed in."""
    ops = accounts.create_organization(slug="ibex-ops", name="IBEX Ops", roles=("operator",))
    client.force_login(person("olga-ops", ops))
    return client


@pytest.fixture
def campus_pool(db, tenant):
    """A private pool `campus` of 2 nodes: Acme AI's queue `acme-train` (8 H100s nominal) and
    a physics group's `physics` (8), both in cohort `uni`, and a daily tidal step."""
    from pool.models import Pool, TidalStep
    from tests.factories import make_org
    from tests.scheduler.pools.builders import queue

    owner = provider_with_nodes(slug="campus-hpc", nodes=2, fabric="campus-fabric")
    Node.objects.filter(provider=owner).update(state="active")
    pool = Pool.objects.create(name="campus", owner=make_org("campus-ops", "operator"))
    pool.nodes.set(Node.objects.filter(provider=owner))
    queue(pool, "acme-train", org=tenant, nominal=8, cohort="uni")
    queue(pool, "physics", org=make_org("physics-lab", "tenant"), nominal=8, cohort="uni")
    TidalStep.objects.create(pool=pool, name="night", daily_at="20:00",
                             nominals={"acme-train": {"H100-80GB": 12},
                                       "physics": {"H100-80GB": 4}})
    return pool


@pytest.fixture
def pool_member_web(tenant_web, campus_pool):
    return tenant_web


@pytest.fixture
def pool_operator_web(operator_web, campus_pool):
    return operator_web

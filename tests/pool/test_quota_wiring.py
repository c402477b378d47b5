"""Quotas in the database and the API: an operator defines a university's quota tree, tenants
read their own pool, bad input is refused by name and nothing is saved."""

import hypothesis
import pytest
from django.db import transaction
from hypothesis import strategies as st

from pool import quotas, services
from pool.core import quotas as core
from pool.models import Node, Pool, Quota, QuotaNode
from tests.factories import client_for, make_org
from tests.pool.conftest import node_body

H100 = "H100-80GB"


@pytest.fixture
def university(db):
    return make_org("state-university", "tenant")


@pytest.fixture
def campus_pool(university, operator):
    return Pool.objects.create(name="campus", owner=operator)


@pytest.fixture
def operator_client(operator):
    return client_for(operator)


def define(client, **body):
    return client.post("/api/v1/quotas/", {"pool": "campus", **body}, format="json")


@pytest.fixture
def university_tree(operator_client, campus_pool, university):
    """university (8 H100 of its own) → physics (8, may borrow 8), chemistry (16, lends 4);
    a visitors queue in a cohort of its own."""
    answers = [
        define(operator_client, name="university", organization=university.slug,
               quotas=[{"gpu_model": H100, "nominal": 8}]),
        define(operator_client, name="physics", parent="university",
               organization=university.slug,
               quotas=[{"gpu_model": H100, "nominal": 8, "borrowing_limit": 8}]),
        define(operator_client, name="chemistry", parent="university",
               quotas=[{"gpu_model": H100, "nominal": 16, "lending_limit": 4}]),
        define(operator_client, name="visitors", cohort="guests",
               quotas=[{"gpu_model": H100, "nominal": 2}]),
    ]
    return answers


def hand_built_tree():
    return core.QuotaTree([
        core.QuotaNode("university", quotas={H100: core.ModelQuota(8)}),
        core.QuotaNode("physics", parent="university",
                       quotas={H100: core.ModelQuota(8, borrowing_limit=8)}),
        core.QuotaNode("chemistry", parent="university",
                       quotas={H100: core.ModelQuota(16, lending_limit=4)}),
        core.QuotaNode("visitors", cohort="guests", quotas={H100: core.ModelQuota(2)}),
    ])


def test_an_operator_defines_a_university_quota_tree_through_the_api(
        university_tree, operator_client):
    listed = operator_client.get("/api/v1/quotas/?pool=campus")

    assert [a.status_code for a in university_tree] == [201, 201, 201, 201]
    assert university_tree[1].json()["parent"] == "university"
    by_name = {n["name"]: n for n in listed.json()}
    assert sorted(by_name) == ["chemistry", "physics", "university", "visitors"]
    assert by_name["university"]["is_queue"] is False
    assert by_name["university"]["organization"] == "state-university"
    assert by_name["visitors"]["cohort"] == "guests"
    physics = by_name["physics"]["quotas"][0]
    assert physics == {"gpu_model": H100, "nominal": 8, "borrowing_limit": 8,
                       "lending_limit": None, "available_if_idle": 16, "used": 0,
                       "borrowed": 0, "lent": 0, "available_now": 16}
    # chemistry: its 12 guaranteed plus the university's pool (8 + physics' 8 + its own 4)
    assert by_name["chemistry"]["quotas"][0]["available_if_idle"] == 32


def test_the_tree_built_from_rows_matches_a_hand_built_one(university_tree, campus_pool):
    tree = quotas.quota_tree(campus_pool)
    expected = hand_built_tree()
    usage = {"physics": {H100: 12}, "chemistry": {H100: 10}}

    assert tree.nodes == expected.nodes
    for name in ("university", "physics", "chemistry", "visitors", "guests"):
        assert core.available_to(tree, name, H100, usage) == \
            core.available_to(expected, name, H100, usage)
    # physics may borrow at most 8 beyond its 8, whatever is left
    assert core.available_to(tree, "physics", H100, usage) == 4


def test_usage_of_the_pool_comes_from_the_leases_the_market_passes(university_tree, campus_pool):
    usage = quotas.usage_of_pool(campus_pool, [("physics", H100, 8), ("physics", H100, 4),
                                               ("elsewhere", H100, 99)])

    assert usage == {"physics": {H100: 12}}


def test_a_tenant_sees_only_the_pools_that_name_it(university_tree, university, tenant_client):
    make_org("other-college", "tenant")
    Pool.objects.create(name="other", owner=make_org("other-ops", "operator"))
    university_client = client_for(university)

    mine = university_client.get("/api/v1/pools/").json()
    theirs = tenant_client.get("/api/v1/pools/").json()

    assert [p["name"] for p in mine["results"]] == ["campus"]
    assert theirs["results"] == []
    assert tenant_client.get("/api/v1/pools/campus/").status_code == 404
    assert tenant_client.get("/api/v1/quotas/?pool=campus").status_code == 404
    assert university_client.get("/api/v1/pools/other/").status_code == 404
    assert len(university_client.get("/api/v1/quotas/?pool=campus").json()) == 4


@pytest.mark.parametrize("query", ["", "?pool=", "?pool=cam%00pus"])
def test_a_quota_listing_without_a_usable_pool_name_is_a_400_naming_pool(operator_client,
                                                                        campus_pool, query):
    response = operator_client.get(f"/api/v1/quotas/{query}")

    assert response.status_code == 400
    assert "pool" in response.json()["error"]["fields"]


def test_only_operators_define_quotas(campus_pool, university):
    answer = define(client_for(university), name="physics",
                    quotas=[{"gpu_model": H100, "nominal": 8}])

    assert answer.status_code == 403
    assert not QuotaNode.objects.exists()


@pytest.mark.parametrize("body, field", [
    ({"name": "physics", "quotas": [{"gpu_model": H100, "nominal": -1}]}, "quotas.0.nominal"),
    ({"name": "physics", "quotas": [{"gpu_model": H100, "nominal": 4, "lending_limit": 6}]},
     "quotas.0.lending_limit"),
    ({"name": "physics", "parent": "nowhere"}, "parent"),
    ({"name": "physics", "quotas": [{"gpu_model": "Z9000", "nominal": 1}]}, "quotas.0.gpu_model"),
    ({"name": "physics", "parent": "university", "cohort": "campus"}, "cohort"),
    ({"name": "physics", "quotas": [{"gpu_model": H100, "nominal": 1, "colour": "red"}]},
     "quotas.0.colour"),
    ({"name": "physics", "pool": "nowhere"}, "pool"),
])
def test_bad_quota_input_is_named_and_nothing_is_saved(operator_client, campus_pool, body,
                                                       field):
    define(operator_client, name="university")
    before = (QuotaNode.objects.count(), Quota.objects.count())

    answer = define(operator_client, **body)

    assert answer.status_code == 400
    assert field in answer.json()["error"]["fields"]
    assert (QuotaNode.objects.count(), Quota.objects.count()) == before


def test_a_cycle_is_refused_and_the_tree_is_unchanged(university_tree, operator_client,
                                                       campus_pool):
    answer = define(operator_client, name="university", parent="physics")

    assert answer.status_code == 400
    assert "cycle" in answer.json()["error"]["fields"]["parent"][0]
    assert QuotaNode.objects.get(name="university").parent is None
    assert quotas.quota_tree(campus_pool).nodes == hand_built_tree().nodes


def test_set_quota_validates_and_changes_one_model(university_tree, campus_pool):
    physics = QuotaNode.objects.get(name="physics")

    with pytest.raises(quotas.QuotaInputError) as refused:
        quotas.set_quota(node=physics, gpu_model=H100, nominal=2, lending_limit=3)
    quotas.set_quota(node=physics, gpu_model=H100, nominal=10, borrowing_limit=0)

    assert refused.value.field == "lending_limit"
    tree = quotas.quota_tree(campus_pool)
    assert tree.node("physics").quota(H100) == core.ModelQuota(10, borrowing_limit=0)
    assert core.available_to(tree, "physics", H100, {}) == 10


def test_a_pool_shows_its_gpus_and_those_bound_now(campus_pool, operator_client,
                                                   provider_client, fabric):
    created = provider_client.post("/api/v1/nodes/", node_body(), format="json").json()
    node = Node.objects.get(pk=created["id"])
    campus_pool.nodes.add(node)
    services.bind_lease(node=node, lease_ref="lease-1", gpu_indexes=[0, 1, 2])

    pool = operator_client.get("/api/v1/pools/campus/").json()

    assert pool["capacity"] == [{"gpu_model": H100, "gpus": 8, "bound": 3}]


def test_the_admin_refuses_a_parent_from_another_pool_or_a_cycle(university_tree, operator):
    from django.core.exceptions import ValidationError

    other = Pool.objects.create(name="elsewhere", owner=operator)
    stray = QuotaNode(pool=other, name="stray", parent=QuotaNode.objects.get(name="physics"))
    university = QuotaNode.objects.get(name="university")
    university.parent = QuotaNode.objects.get(name="physics")

    with pytest.raises(ValidationError, match="same pool"):
        stray.full_clean()
    with pytest.raises(ValidationError, match="cycle"):
        university.full_clean()


NAMES = ["university", "physics", "chemistry", "guests"]
_limit = st.none() | st.integers(-2, 20)
_quota = st.fixed_dictionaries({"gpu_model": st.sampled_from([H100, "A100-80GB", "Z9000"]),
                                "nominal": st.integers(-2, 20), "borrowing_limit": _limit,
                                "lending_limit": _limit})
_body = st.fixed_dictionaries({
    "name": st.sampled_from(NAMES), "parent": st.none() | st.sampled_from(NAMES),
    "cohort": st.sampled_from(["", *NAMES]), "quotas": st.lists(_quota, max_size=3)})


@hypothesis.settings(max_examples=60, deadline=None,
                     suppress_health_check=list(hypothesis.HealthCheck))
@hypothesis.given(bodies=st.lists(_body, min_size=1, max_size=8))
def test_whatever_an_operator_sends_the_stored_tree_stays_valid(operator_client, campus_pool,
                                                                bodies):
    with transaction.atomic():
        answers = [define(operator_client, **body).status_code for body in bodies]
        tree = quotas.quota_tree(campus_pool)
        listed = operator_client.get("/api/v1/quotas/?pool=campus")
        transaction.set_rollback(True)

    assert set(answers) <= {201, 400}
    assert listed.status_code == 200
    assert sorted(tree.nodes) == sorted({n["name"] for n in listed.json()}
                                        | {n["cohort"] for n in listed.json() if n["cohort"]})

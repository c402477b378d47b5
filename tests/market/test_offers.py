"""`GET /api/v1/offers/`: free capacity grouped and filtered by a query, in the database."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from market import leasing, prices
from pool.models import Gpu, HealthEvent, Node
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes


@pytest.fixture
def hpc(db):
    """4 nodes of 8 H100s (2 leaves of 2 nodes) at 2.50, one node at 2.00."""
    provider = provider_with_nodes(slug="hpc-provider", nodes=4)
    Node.objects.filter(provider=provider).update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_500_000,
                      actor="test")
    prices.set_prices(provider=provider, scope={"node": gpus_of(provider)[0].node.hostname},
                      price_micros=2_000_000, actor="test")
    return provider


@pytest.fixture
def budget(db):
    """2 nodes of 8 A100s at 1.20, every GPU shareable."""
    provider = provider_with_nodes(slug="budget-dc", nodes=2, gpu_model="A100-80GB",
                                   fabric="budget")
    Node.objects.filter(provider=provider).update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "budget"}, price_micros=1_200_000,
                      actor="test", shareable=True)
    return provider


@pytest.fixture
def tenant_client(db):
    return client_for(make_org("acme-ai", "tenant"), scopes=("read",))


def offers(client, **params):
    response = client.get("/api/v1/offers/", params)
    assert response.status_code == 200, response.json()
    return response.json()


def hold(gpus, hours=2, part="whole", span=(0, 1000), mig_profile=""):
    """A lease holding these GPUs (or one part of each) from now."""
    tenant = make_org(f"holder-{Gpu.objects.filter(allocations__isnull=False).count()}-"
                      f"{gpus[0].pk}", "tenant")
    now = timezone.now()
    lease = leasing.create_lease(
        tenant=tenant, tier="on_demand", gpu_model=gpus[0].gpu_model.name,
        gpus=[leasing.GpuChoice(g.pk, 1) for g in gpus], starts_at=now,
        ends_at=now + timedelta(hours=hours), price_micros=1, max_price_micros=1,
        locality={}, actor="test")
    if part != "whole":
        lease.allocations.update(part=part, span=NumericRange(*span), mig_profile=mig_profile)
    return lease


def test_it_groups_free_gpus_by_model_cheapest_first(hpc, budget, tenant_client):
    body = offers(tenant_client)

    assert body["count"] == 2
    a100, h100 = body["results"]
    assert a100 == {"model": "A100-80GB", "gpus": 16, "price_per_gpu_hour": "1.20",
                    "max_price_per_gpu_hour": "1.20", "leaf_free": 16, "spine_free": 16,
                    "reliability": "1.0000",
                    "mig_profiles": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb",
                                     "7g.80gb"],
                    "shares": True}
    assert h100["model"] == "H100-80GB" and h100["gpus"] == 32
    assert (h100["price_per_gpu_hour"], h100["max_price_per_gpu_hour"]) == ("2.00", "2.50")
    assert (h100["leaf_free"], h100["mig_profiles"], h100["shares"]) == (16, [], False)


def test_gpus_held_over_the_next_hour_are_not_free(hpc, tenant_client):
    first_node = gpus_of(hpc)[:8]
    hold(first_node)

    (h100,) = offers(tenant_client)["results"]

    assert h100["gpus"] == 24
    assert h100["leaf_free"] == 16  # the other leaf is whole
    assert h100["price_per_gpu_hour"] == "2.50"  # the 2.00 node is taken


def test_gpus_not_for_sale_are_not_offered(hpc, tenant_client):
    Node.objects.filter(hostname=gpus_of(hpc)[8].node.hostname).update(state="draining")
    Gpu.objects.filter(pk=gpus_of(hpc)[0].pk).update(health="failed")

    assert offers(tenant_client)["results"][0]["gpus"] == 32 - 8 - 1


def test_a_price_offered_only_later_is_not_free_now(hpc, tenant_client):
    later = timezone.now() + timedelta(hours=3)
    prices.set_prices(provider=hpc, scope={"leaf": gpus_of(hpc)[0].node.host.leaf},
                      price_micros=2_500_000, actor="test", offered_from=later)

    assert offers(tenant_client)["results"][0]["gpus"] == 16


def test_per_gpu_terms_filter_before_grouping(hpc, budget, tenant_client):
    by_model = offers(tenant_client, q="model=H100-80GB")["results"]
    by_provider = offers(tenant_client, q="provider in [budget-dc,nobody]")["results"]
    not_lab = offers(tenant_client, q='fabric!="lab"')["results"]

    assert [r["model"] for r in by_model] == ["H100-80GB"]
    assert [r["model"] for r in by_provider] == ["A100-80GB"]
    assert [r["model"] for r in not_lab] == ["A100-80GB"]


def test_aggregate_terms_filter_the_groups(hpc, budget, tenant_client):
    assert [r["model"] for r in offers(tenant_client, q="gpus>=32")["results"]] == ["H100-80GB"]
    assert [r["model"] for r in offers(tenant_client, q="leaf_free<16")["results"]] == []
    assert [r["model"] for r in offers(tenant_client, q="spine_free>=17")["results"]] == [
        "H100-80GB"]


def test_price_compares_as_a_decimal_against_the_cheapest_gpu(hpc, tenant_client):
    assert offers(tenant_client, q="price<=2")["count"] == 1
    assert offers(tenant_client, q="price<2.00")["count"] == 0
    assert offers(tenant_client, q="price<2.000001")["count"] == 1
    assert offers(tenant_client, q="price in [1.5,2.0]")["count"] == 1


def test_it_groups_by_leaf_with_its_fabric_and_by_provider(hpc, budget, tenant_client):
    rows = offers(tenant_client, group_by="leaf,provider", q="model=H100-80GB")["results"]

    assert len(rows) == 2
    assert set(rows[0]) >= {"model", "fabric", "leaf", "provider"}
    assert {(r["fabric"], r["provider"], r["gpus"]) for r in rows} == {
        ("lab", "hpc-provider", 16)}
    assert rows[0]["price_per_gpu_hour"] == "2.00"  # cheapest first


def test_sort_descending_either_way_limit_and_count(hpc, budget, tenant_client):
    minus_before = offers(tenant_client, sort="-gpus", limit=1)
    minus_after = offers(tenant_client, sort="gpus-", limit=1)
    by_name = offers(tenant_client, sort="model-")

    assert minus_before == minus_after
    assert minus_before["count"] == 2 and len(minus_before["results"]) == 1
    assert minus_before["results"][0]["model"] == "H100-80GB"
    assert [r["model"] for r in by_name["results"]] == ["H100-80GB", "A100-80GB"]


def test_reliability_is_the_providers_measured_availability_over_30_days(hpc, budget,
                                                                          tenant_client):
    now = timezone.now()
    Node.objects.update(created_at=now - timedelta(days=40))
    node = gpus_of(hpc)[0].node
    down = HealthEvent.objects.create(node=node, kind="node_unreachable", from_value="reachable",
                                      to_value="unreachable")
    up = HealthEvent.objects.create(node=node, kind="node_reachable", from_value="unreachable",
                                    to_value="reachable")
    HealthEvent.objects.filter(pk=down.pk).update(at=now - timedelta(days=10))
    HealthEvent.objects.filter(pk=up.pk).update(at=now - timedelta(days=10, hours=-3))

    rows = offers(tenant_client, group_by="provider")["results"]

    # 8 GPUs down 3 h and 45 s (three missed 15 s heartbeats) of 32 GPUs × 30 days
    assert {r["provider"]: r["reliability"] for r in rows} == {"budget-dc": "1.0000",
                                                                "hpc-provider": "0.9990"}
    assert [r["provider"] for r in offers(tenant_client, group_by="provider",
                                          q="reliability>=0.9995")["results"]] == ["budget-dc"]


def test_a_failed_gpu_counts_down_until_it_is_ok_again(hpc, tenant_client):
    now = timezone.now()
    Node.objects.update(created_at=now - timedelta(days=40))
    gpu = gpus_of(hpc)[5]
    failed = HealthEvent.objects.create(node=gpu.node, gpu=gpu, kind="gpu_health",
                                        from_value="ok", to_value="failed")
    HealthEvent.objects.filter(pk=failed.pk).update(at=now - timedelta(days=30 * 32 / 100))

    (row,) = offers(tenant_client)["results"]  # the failed GPU is not offered: it is still down

    assert row["reliability"] == "0.9900"  # 1 GPU of 32 down 32 % of the window
    assert row["gpus"] == 32  # its health field was left ok: only the event says it failed


def test_mig_profile_selects_shareable_gpus_of_models_that_have_it(hpc, budget, tenant_client):
    rows = offers(tenant_client, q="mig_profile=3g.40gb")["results"]

    assert [r["model"] for r in rows] == ["A100-80GB"]
    assert offers(tenant_client, q="mig_profile=1g.18gb")["results"] == []


def test_share_counts_gpus_with_a_free_run_that_wide_even_when_shared(budget, tenant_client):
    gpus = gpus_of(budget)
    hold(gpus[:7])  # whole GPUs: no room
    hold(gpus[7:8], part="share", span=(0, 500))  # half of GPU 7 is left

    assert offers(tenant_client, q="share>=500")["results"][0]["gpus"] == 8 + 1
    assert offers(tenant_client, q="share>500")["results"][0]["gpus"] == 8
    assert offers(tenant_client, q="share=true")["results"][0]["gpus"] == 9
    assert offers(tenant_client)["results"][0]["gpus"] == 8  # whole and free only


def test_share_false_keeps_gpus_that_sell_no_parts(hpc, budget, tenant_client):
    assert [r["model"] for r in offers(tenant_client, q="share=false")["results"]] == [
        "H100-80GB"]


def test_a_provider_key_with_read_finds_offers(hpc):
    client = client_for(hpc, scopes=("read",))

    assert offers(client)["count"] == 1


def test_a_malformed_query_is_a_400_naming_the_term_and_column(hpc, tenant_client):
    response = tenant_client.get("/api/v1/offers/", {"q": "gpus>=8 colour=red"})

    assert response.status_code == 400
    assert response.json() == {"error": {"code": "invalid", "message": "Invalid input.",
                                          "fields": {"q": [
        "term 2 at column 9: unknown field 'colour' (fields: model, gpus, price, leaf_free, "
        "spine_free, reliability, fabric, provider, mig_profile, share)"]}}}


@pytest.mark.parametrize(("params", "field"), [
    ({"group_by": "model,colour"}, "group_by"),
    ({"sort": "colour"}, "sort"),
    ({"sort": "leaf"}, "sort"),  # not a group key here
    ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"),
    ({"q": "price<=cheap"}, "q"),
])
def test_bad_parameters_are_a_400_naming_the_parameter(hpc, tenant_client, params, field):
    response = tenant_client.get("/api/v1/offers/", params)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_it_answers_in_a_fixed_number_of_queries(hpc, budget, tenant_client):
    offers(tenant_client)  # the key's first use is recorded once
    with CaptureQueriesContext(connection) as few:
        offers(tenant_client, q="gpus>=1")
    provider_with_nodes(slug="third-dc", nodes=8, fabric="third")
    Node.objects.update(state="active")
    prices.set_prices(provider=Node.objects.filter(fabric__name="third").first().provider,
                      scope={"fabric": "third"}, price_micros=3_000_000, actor="test")
    with CaptureQueriesContext(connection) as more:
        offers(tenant_client, q="gpus>=1")

    assert len(more) == len(few)

import threading

import pytest
from django.db import connection

from market import prices
from market.models import GpuPrice
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes


@pytest.fixture
def provider(db):
    return provider_with_nodes()


@pytest.fixture
def provider_client(provider):
    return client_for(provider)


def set_price(client, scope, price="2.50", **extra):
    return client.post("/api/v1/prices/", {"scope": scope, "price_per_gpu_hour": price, **extra},
                       format="json")


def current(provider) -> dict[int, int]:
    return prices.current_prices(g.pk for g in gpus_of(provider))


def test_a_provider_prices_a_whole_fabric_and_model_at_once(provider_client, provider):
    response = set_price(provider_client, {"fabric": "lab", "gpu_model": "H100-80GB"})

    assert response.status_code == 201, response.json()
    assert response.json() == {"gpus_priced": 32, "price_per_gpu_hour": "2.50"}
    assert set(current(provider).values()) == {2_500_000}


@pytest.mark.parametrize("scope, count", [
    ({"node": "hpc-provider-01"}, 8),
    ({"leaf": "leaf01"}, 16),
    ({"fabric": "lab", "gpu_model": "A100-80GB"}, None),
])
def test_a_narrower_scope_prices_only_its_gpus(provider_client, provider, scope, count):
    set_price(provider_client, {"fabric": "lab"}, "2.00")

    response = set_price(provider_client, scope, "3.00")

    if count is None:
        assert response.status_code == 400
        assert "scope" in response.json()["error"]["fields"]
        assert set(current(provider).values()) == {2_000_000}
    else:
        assert response.json()["gpus_priced"] == count
        assert sorted(current(provider).values()).count(3_000_000) == count


def test_one_gpu_can_be_priced_by_id_and_every_change_is_kept(provider_client, provider):
    gpu = gpus_of(provider)[0]
    set_price(provider_client, {"gpu": gpu.pk}, "2.00")
    set_price(provider_client, {"gpu": gpu.pk}, "2.25")

    history = provider_client.get(f"/api/v1/prices/?gpu={gpu.pk}").json()["results"]

    assert [(p["price_per_gpu_hour"], p["current"]) for p in history] == [
        ("2.25", True), ("2.00", False)]


@pytest.mark.parametrize("body, field", [
    ({"scope": {"fabric": "lab"}, "price_per_gpu_hour": "-1.00"}, "price_per_gpu_hour"),
    ({"scope": {"fabric": "lab"}, "price_per_gpu_hour": 2.5}, "price_per_gpu_hour"),
    ({"scope": {"rack": "r1"}, "price_per_gpu_hour": "1.00"}, "scope.rack"),
    ({"scope": {}, "price_per_gpu_hour": "1.00"}, "scope.non_field_errors"),
    ({"scope": {"fabric": "lab"}, "price_per_gpu_hour": "1.00",
      "offered_from": "2026-12-02T00:00:00Z", "offered_until": "2026-12-01T00:00:00Z"},
     "offered_until"),
])
def test_bad_price_changes_name_the_field_and_change_nothing(provider_client, provider, body,
                                                            field):
    response = provider_client.post("/api/v1/prices/", body, format="json")

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]
    assert GpuPrice.objects.count() == 0


def test_a_rival_provider_cannot_price_or_see_anothers_gpus(provider_client, provider):
    rival = client_for(make_org("rival-cloud", "provider"))
    gpu = gpus_of(provider)[0]
    set_price(provider_client, {"gpu": gpu.pk})

    refused = set_price(rival, {"gpu": gpu.pk}, "0.10")

    assert refused.status_code == 400
    assert rival.get("/api/v1/prices/").json()["results"] == []
    assert current(provider)[gpu.pk] == 2_500_000


def test_a_tenant_cannot_set_prices(db, provider):
    tenant = client_for(make_org("acme-ai", "tenant"))

    assert set_price(tenant, {"fabric": "lab"}).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_concurrent_price_changes_leave_exactly_one_current_price_per_gpu():
    provider = provider_with_nodes()
    barrier = threading.Barrier(8)
    errors = []

    def change(price):
        barrier.wait()
        try:
            prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=price,
                              actor="race")
        except Exception as exc:  # the test reports any failure, whatever its kind
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=change, args=(1_000_000 + n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert GpuPrice.objects.filter(superseded_at__isnull=True).count() == 32
    assert GpuPrice.objects.count() == 8 * 32
    assert len(set(current(provider).values())) == 1


@pytest.mark.parametrize("price, says", [
    ("1e3", "is not a plain decimal amount"),
    ("2.5000001", "has more than 6 decimals"),
    ("0.00", "A price must be above zero."),
    ("0", "A price must be above zero."),
    ("99999999999999999999", "amounts are under 1,000,000,000,000 dollars"),
    ("1,000.00", "is not a plain decimal amount"),
    (" ", "is not a plain decimal amount"),
    (True, "Write amounts as decimal strings"),
])
def test_each_bad_price_gets_its_own_message_and_changes_nothing(provider_client, provider,
                                                                 price, says):
    response = set_price(provider_client, {"fabric": "lab"}, price=price)

    assert response.status_code == 400
    assert says in response.json()["error"]["fields"]["price_per_gpu_hour"][0]
    assert GpuPrice.objects.count() == 0


@pytest.mark.parametrize("price, micros", [("2", 2_000_000), ("2.5", 2_500_000),
                                           ("2.000001", 2_000_001), (3, 3_000_000)])
def test_plain_decimals_up_to_the_micro_dollar_are_taken_exactly(provider_client, provider,
                                                                price, micros):
    assert set_price(provider_client, {"fabric": "lab"}, price=price).status_code in (200, 201)
    assert set(current(provider).values()) == {micros}


def test_the_schema_states_the_pattern_the_parser_applies(client, db):
    import re

    import yaml

    from billing.core.money import DOLLARS_PATTERN

    schema = yaml.safe_load(client.get("/api/v1/schema/").content)
    patterns = {prop["pattern"] for component in schema["components"]["schemas"].values()
                for name, prop in component.get("properties", {}).items()
                if name == "price_per_gpu_hour" and "pattern" in prop}
    assert patterns == {DOLLARS_PATTERN}
    pattern = DOLLARS_PATTERN
    assert re.match(pattern, "2.50") and not re.match(pattern, "1e3")

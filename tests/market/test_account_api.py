from market.models import Entry, SpendLimit
from tests.factories import client_for, fund


def test_a_tenant_sees_balances_as_dollar_strings(tenant, tenant_client):
    fund(tenant, "123.45")

    body = tenant_client.get("/api/v1/account/").json()

    assert body == {"organization": "acme-ai", "currency": "usd", "available": "123.45",
                    "held": "0.00", "payable": "0.00", "held_back": "0.00",
                    "spend_limit_per_hour": None, "spend_limit_per_month": None}


def test_a_tenant_lists_its_own_entries_and_not_a_rivals(tenant, rival_tenant, tenant_client):
    fund(tenant, "10.00", reason="welcome")
    fund(rival_tenant, "99.00")

    results = tenant_client.get("/api/v1/account/entries/").json()["results"]

    assert [(e["account"], e["amount"], e["cause"], e["memo"]) for e in results] == [
        ("tenant_available", "10.00", "grant", "welcome")]


def test_a_tenant_sets_spend_limits(tenant, tenant_client):
    response = tenant_client.patch("/api/v1/account/", {
        "spend_limit_per_hour": "50.00", "spend_limit_per_month": None}, format="json")

    assert response.status_code == 200
    assert response.json()["spend_limit_per_hour"] == "50.00"
    assert SpendLimit.objects.get(organization=tenant).per_hour_micros == 50_000_000


def test_a_bad_limit_is_refused_naming_the_field_and_nothing_changes(tenant, tenant_client):
    for body, field in (({"spend_limit_per_hour": 1.5, "spend_limit_per_month": None},
                         "spend_limit_per_hour"),
                        ({"spend_limit_per_hour": "-1", "spend_limit_per_month": None},
                         "spend_limit_per_hour"),
                        ({"spend_limit_per_hour": None, "spend_limit_per_month": None,
                          "currency": "eur"}, "currency")):
        response = tenant_client.patch("/api/v1/account/", body, format="json")
        assert response.status_code == 400
        assert field in response.json()["error"]["fields"]
    assert not SpendLimit.objects.exists()


def test_a_read_only_key_cannot_change_limits(tenant):
    client = client_for(tenant, scopes=("read",))
    response = client.patch("/api/v1/account/", {"spend_limit_per_hour": "1.00",
                                                  "spend_limit_per_month": None}, format="json")
    assert response.status_code == 403
    assert Entry.objects.count() == 0

from billing.models import Entry, SpendLimit
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


def entries(client, **query):
    return [(e["account"], e["cause"], e["amount"])
            for e in client.get("/api/v1/account/entries/", query).json()["results"]]


def test_entries_filter_by_account_cause_and_source(tenant, tenant_client):
    from billing import services

    grant = fund(tenant, "10.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=4_000_000)

    assert entries(tenant_client, account="tenant_held") == [("tenant_held", "hold", "4.00")]
    assert entries(tenant_client, cause="grant") == [("tenant_available", "grant", "10.00")]
    assert len(entries(tenant_client, source_type="hold", source_id=str(hold.pk))) == 2
    assert entries(tenant_client, source_type="credit_grant", source_id=str(grant.pk)) == [
        ("tenant_available", "grant", "10.00")]
    assert entries(tenant_client, since="2999-01-01T00:00:00Z") == []
    assert len(entries(tenant_client, before="2999-01-01T00:00:00Z")) == 3


def test_an_unknown_filter_value_is_refused_naming_the_field(tenant_client):
    response = tenant_client.get("/api/v1/account/entries/", {"cause": "theft"})
    assert response.status_code == 400 and "cause" in response.json()["error"]["fields"]


def test_listing_entries_takes_the_same_queries_for_many_as_for_few(
        tenant, tenant_client, django_assert_max_num_queries):
    for _ in range(20):
        fund(tenant, "1.00")
    with django_assert_max_num_queries(6):
        assert len(entries(tenant_client)) == 20


def test_bad_money_input_leaves_the_ledger_as_it_was(tenant, tenant_client, fake_stripe):
    fund(tenant, "10.00")
    before = Entry.objects.count()
    for path, body, field in (("/api/v1/account/topups/", {"amount": "-10.00"}, "amount"),
                              ("/api/v1/account/topups/", {}, "amount"),
                              ("/api/v1/account/refunds/", {"amount": "0.001"}, "amount"),
                              ("/api/v1/account/refunds/", {"amount": "1", "to": "x"}, "to")):
        response = tenant_client.post(path, body, format="json")
        assert response.status_code == 400, (path, body)
        assert field in response.json()["error"]["fields"], (path, body)
    assert Entry.objects.count() == before

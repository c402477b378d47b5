from urllib.parse import quote

from billing import services as money
from tests.factories import client_for, make_org


def test_a_since_filter_with_an_offset_postgresql_cannot_hold_still_answers(db):
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=5_000_000, reason="t", actor="t")
    client = client_for(tenant)

    # +23:06 is a valid ISO offset that PostgreSQL refuses (it stops at ±15:59)
    response = client.get(f"/api/v1/account/entries/?since={quote('2026-01-01T00:00:00+23:06')}")

    assert response.status_code == 200
    assert len(response.json()["results"]) == 1

from ibex.accounts.models import ApiKey


def test_a_new_key_is_shown_once_and_works(tenant_web, tenant, client):
    response = tenant_web.post("/app/keys/", {"name": "ci", "scopes": ["read", "trade"]})

    page = response.content.decode()
    key = ApiKey.objects.get(organization=tenant, name="ci")
    assert key.scopes == ["read", "trade"]
    raw = page.split('id="raw-key">')[1].split("<")[0]
    assert raw.startswith(f"ibex_{key.prefix}_")
    assert raw not in tenant_web.get("/app/keys/").content.decode()
    api = client.get("/api/v1/orders/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 200


def test_revoking_a_key(tenant_web, tenant):
    tenant_web.post("/app/keys/", {"name": "old", "scopes": ["read"]})
    key = ApiKey.objects.get(organization=tenant, name="old")

    tenant_web.post(f"/app/keys/{key.pk}/revoke/")

    key.refresh_from_db()
    assert key.revoked_at is not None


def test_another_organisations_key_cannot_be_revoked(tenant_web, provider):
    from ibex.accounts import services as accounts

    issued = accounts.issue_api_key(organization=provider, scopes=["read"])

    assert tenant_web.post(f"/app/keys/{issued.api_key.pk}/revoke/").status_code == 404
    issued.api_key.refresh_from_db()
    assert issued.api_key.revoked_at is None

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from ibex.accounts.models import ApiKey, Organization, ProviderProfile
from tests.factories import client_for, make_org

pytestmark = pytest.mark.django_db

SIGN_UP = {"slug": "new-gpus", "name": "New GPUs", "roles": ["provider"],
           "username": "ada", "email": "ada@example.com", "password": "a-long-Passw0rd!"}


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_anyone_can_sign_up_an_organisation_and_gets_a_first_key(api_client):
    response = api_client.post("/api/v1/orgs/", SIGN_UP, format="json")

    body = response.json()
    assert response.status_code == 201, body
    assert body["roles"] == ["provider"]
    me = bearer(body["api_key"]).get("/api/v1/me/").json()
    assert me["organizations"] == ["new-gpus"]
    assert sorted(me["scopes"]) == ["admin", "provide", "read"]
    assert ProviderProfile.objects.get(organization__slug="new-gpus").state == "pending"


def test_sign_up_cannot_claim_the_operator_role(api_client):
    response = api_client.post("/api/v1/orgs/", {**SIGN_UP, "roles": ["operator"]}, format="json")

    assert response.status_code == 400
    assert "roles.0" in response.json()["error"]["fields"] or "roles" in response.json()["error"]["fields"]
    assert not Organization.objects.exists()


def test_sign_up_names_missing_fields_and_unknown_ones(api_client):
    response = api_client.post("/api/v1/orgs/", {"slug": "x", "name": "X", "roles": ["tenant"],
                                                 "favourite": "GPU"}, format="json")

    assert response.status_code == 400
    assert "favourite" in response.json()["error"]["fields"]


def test_an_admin_key_issues_narrower_keys_but_not_wider_ones(api_client):
    admin_key = api_client.post("/api/v1/orgs/", SIGN_UP, format="json").json()["api_key"]
    client = bearer(admin_key)

    narrow = client.post("/api/v1/keys/", {"name": "agent", "scopes": ["provide"]}, format="json")
    wide = client.post("/api/v1/keys/", {"scopes": ["trade"]}, format="json")

    assert narrow.status_code == 201 and narrow.json()["key"].startswith("ibex_")
    assert wide.status_code == 400
    assert "scopes" in wide.json()["error"]["fields"]


def test_a_key_without_admin_scope_cannot_issue_keys():
    org = make_org("acme-ai", "tenant")

    response = client_for(org, scopes=("read", "trade")).post(
        "/api/v1/keys/", {"scopes": ["read"]}, format="json")

    assert response.status_code == 403


def test_revoking_a_key_stops_it_and_another_orgs_key_is_a_404(api_client):
    admin_key = api_client.post("/api/v1/orgs/", SIGN_UP, format="json").json()["api_key"]
    client = bearer(admin_key)
    other = client.post("/api/v1/keys/", {"scopes": ["read"]}, format="json").json()
    rival = client_for(make_org("rival", "provider"), scopes=("read", "admin"))

    assert rival.delete(f"/api/v1/keys/{other['id']}/").status_code == 404
    assert client.delete(f"/api/v1/keys/{other['id']}/").status_code == 204
    assert bearer(other["key"]).get("/api/v1/me/").status_code == 401
    assert ApiKey.objects.get(pk=other["id"]).revoked_at is not None


def test_a_provider_updates_payout_details_and_cannot_verify_itself(api_client):
    client = bearer(api_client.post("/api/v1/orgs/", SIGN_UP, format="json").json()["api_key"])

    updated = client.patch("/api/v1/provider/", {"legal_name": "New GPUs Ltd", "country": "GB",
                                                 "payout_email": "pay@example.com"}, format="json")
    sneaky = client.patch("/api/v1/provider/", {"state": "verified"}, format="json")
    bad = client.patch("/api/v1/provider/", {"country": "Britain"}, format="json")

    assert updated.status_code == 200 and updated.json()["country"] == "GB"
    assert sneaky.status_code == 400 and "state" in sneaky.json()["error"]["fields"]
    assert bad.status_code == 400 and "country" in bad.json()["error"]["fields"]
    assert client.get("/api/v1/provider/").json()["state"] == "pending"


def test_an_operator_verifies_and_suspends_a_provider_by_command(capsys):
    org = make_org("hpc", "provider")

    call_command("verify_provider", "hpc")
    call_command("verify_provider", "hpc", "--suspend", "--reason", "failed audit")

    profile = ProviderProfile.objects.get(organization=org)
    assert profile.state == "suspended"
    assert [(c.from_state, c.to_state) for c in profile.changes.all()] == [
        ("pending", "verified"), ("verified", "suspended")]
    assert "hpc is now suspended" in capsys.readouterr().out


def test_create_api_key_prints_the_key_alone_on_its_last_line(capsys):
    call_command("create_api_key", "--org", "boot", "--create-org", "--role", "operator",
                 "--scopes", "read", "admin")

    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("ibex_")
    assert bearer(last_line).get("/api/v1/me/").json()["scopes"] == ["admin", "read"]


@pytest.mark.parametrize("role, scopes", [("tenant", ["read", "trade"]),
                                          ("provider", ["provide", "read"]),
                                          ("operator", ["admin", "read"])])
def test_a_keys_default_scopes_follow_the_organisations_role(capsys, role, scopes):
    call_command("create_api_key", "--org", f"new-{role}", "--create-org", "--role", role)

    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert bearer(key).get("/api/v1/me/").json()["scopes"] == scopes


def test_the_readmes_provider_key_can_register_a_node(capsys):
    from fabric import services as fabric_services
    from fabric.core import generators
    from ibex.accounts.models import Organization

    call_command("create_api_key", "--org", "new-dc", "--create-org", "--role", "provider")
    key = capsys.readouterr().out.strip().splitlines()[-1]
    fabric_services.save_fabric(owner=Organization.objects.get(slug="new-dc"), name="lab",
                                spec=generators.fat_tree(4, 4, tiers=2), source="generator")

    response = bearer(key).post("/api/v1/nodes/", {
        "hostname": "node01", "fabric": "lab", "gpu_model": "H100-80GB", "gpu_count": 8,
        "cpu_cores": 64, "memory_gib": 512}, format="json")

    assert response.status_code == 201, response.json()

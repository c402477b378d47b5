from django.contrib.auth import get_user_model

from ibex.accounts.models import Membership, Organization
from tests.web.conftest import PASSWORD

FORM = {"username": "nina", "password1": PASSWORD, "password2": PASSWORD,
        "organization": "Nina Labs", "roles": ["tenant"]}


def test_it_creates_a_person_their_organisation_and_signs_them_in(client, db):
    response = client.post("/signup/", FORM)

    assert response.status_code == 302 and response["Location"] == "/home/"
    org = Organization.objects.get(slug="nina-labs")
    assert org.is_tenant and not org.is_provider
    assert Membership.objects.get(organization=org).role == "owner"
    assert client.get("/home/")["Location"] == "/app/"


def test_a_provider_lands_on_the_fleet(client, db):
    client.post("/signup/", {**FORM, "roles": ["provider"]})

    assert Organization.objects.get(slug="nina-labs").provider_profile.state == "pending"
    assert client.get("/home/")["Location"] == "/provider/"


def test_a_taken_organisation_name_is_refused_next_to_its_field(client, db):
    Organization.objects.create(slug="nina-labs", name="Nina Labs")

    response = client.post("/signup/", FORM)

    assert response.status_code == 200
    assert "An organisation of this name exists already." in response.content.decode()
    assert not get_user_model().objects.filter(username="nina").exists()


def test_logging_in_and_out(client, tenant_person):
    response = client.post("/login/", {"username": "tess-tenant", "password": PASSWORD})
    assert response["Location"] == "/home/"

    assert client.post("/logout/")["Location"] == "/"
    assert client.get("/app/")["Location"].startswith("/login/")

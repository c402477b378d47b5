"""After logging in, each role lands on its own home page, never on another role's 403."""


def test_an_operator_lands_on_the_operations_page(operator_web):
    response = operator_web.get("/home/", follow=True)

    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/ops/"


def test_a_provider_lands_on_its_fleet(provider_web):
    assert provider_web.get("/home/").url == "/provider/"


def test_a_tenant_lands_on_its_dashboard(tenant_web):
    assert tenant_web.get("/home/").url == "/app/"


def test_the_operators_login_ends_on_a_page_it_may_see(client, db):
    from ibex.accounts import services as accounts
    from tests.web.conftest import PASSWORD, person

    ops = accounts.create_organization(slug="ibex-ops", name="IBEX Ops", roles=("operator",))
    person("olga", ops)

    response = client.post("/login/", {"username": "olga", "password": PASSWORD}, follow=True)

    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/ops/"

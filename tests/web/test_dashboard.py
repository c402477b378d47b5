from billing.services import balances_of
from market import prices
from market.models import Lease, Order

ORDER = {"gpu_model": "H100-80GB", "gpus": "8", "hours": "2", "tier": "on_demand",
         "max_price": "3.00", "level": "node", "strict": "required", "fill": "fill_or_kill",
         "idempotency_key": "k-1"}


def test_the_dashboard_needs_a_signed_in_tenant(client, db):
    assert client.get("/app/")["Location"].startswith("/login/?next=/app/")


def test_it_shows_the_balance_and_refreshes_tables_every_five_seconds(tenant_web):
    page = tenant_web.get("/app/").content.decode()

    assert "$1,000.00" in page
    assert 'hx-get="/app/activity/"' in page and 'hx-trigger="every 5s"' in page
    assert "No leases yet" in tenant_web.get("/app/activity/").content.decode()


def test_an_on_demand_order_fills_and_the_lease_shows_its_gpus_and_locality(
        tenant_web, tenant, provider):
    response = tenant_web.post("/app/", ORDER)

    assert response.status_code == 302
    order = Order.objects.get(tenant=tenant)
    assert order.state == "filled" and order.topology == {"required": "node"}
    page = tenant_web.get("/app/").content.decode()
    assert f"Order {order.pk} filled" in page
    lease = Lease.objects.get(tenant=tenant)
    assert f'data-lease="{lease.pk}"' in page
    assert "1 leaf · 1 spine · 0 hops" in page
    assert "/0-7</div>" in page  # the node and the indexes of its GPUs


def test_the_same_form_posted_twice_places_one_order(tenant_web, tenant, provider):
    tenant_web.post("/app/", ORDER)
    tenant_web.post("/app/", ORDER)

    assert Order.objects.filter(tenant=tenant).count() == 1


def test_a_refused_order_says_why(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**ORDER, "max_price": "1.00", "idempotency_key": "k-2"})

    page = tenant_web.get("/app/").content.decode()
    order = Order.objects.get(tenant=tenant)
    assert order.state == "refused"
    assert f"Order {order.pk} refused" in page and order.reason in page


def test_bad_input_is_shown_next_to_its_field_and_places_nothing(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**ORDER, "gpus": "0", "max_price": "abc",
                                         "tier": "reserved"})

    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_gpus_error"' in page and 'id="id_max_price_error"' in page
    assert "A reserved order needs a start window." in page
    assert not Order.objects.exists()


def test_a_service_refusal_naming_a_field_is_shown_there(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**ORDER, "gpus": "500"})

    assert response.status_code == 400
    assert 'id="id_gpus_error"' in response.content.decode()
    assert "no fabric has 500 GPUs" in response.content.decode()


def test_terminating_a_lease_through_htmx_answers_the_tables(tenant_web, tenant, provider):
    tenant_web.post("/app/", ORDER)
    lease = Lease.objects.get(tenant=tenant)

    response = tenant_web.post(f"/app/leases/{lease.pk}/terminate/", HTTP_HX_REQUEST="true")

    lease.refresh_from_db()
    assert lease.state == "terminated"
    assert response.status_code == 200 and 'id="leases"' in response.content.decode()


def test_another_tenants_lease_cannot_be_terminated(client, tenant_web, tenant, provider):
    from ibex.accounts import services as accounts
    from tests.web.conftest import person

    tenant_web.post("/app/", ORDER)
    lease = Lease.objects.get(tenant=tenant)
    rival = accounts.create_organization(slug="rival-labs", roles=("tenant",))
    client.force_login(person("rita-rival", rival))

    assert client.post(f"/app/leases/{lease.pk}/terminate/").status_code == 404
    lease.refresh_from_db()
    assert lease.state != "terminated"
    assert balances_of(rival).available_micros == 0


def test_gpus_are_listed_per_node_with_their_indexes_as_ranges():
    from types import SimpleNamespace as NS

    from web.views_tenant import gpu_list

    allocations = [NS(gpu=NS(node=NS(hostname=host), index=index), part="whole")
                   for host, index in [("n1", 0), ("n1", 1), ("n1", 2), ("n1", 5), ("n2", 3)]]
    parts = [NS(gpu=NS(node=NS(hostname="n3"), index=0), part="mig", mig_profile="1g.10gb"),
             NS(gpu=NS(node=NS(hostname="n3"), index=1), part="share", span=NS(lower=0, upper=250))]

    assert gpu_list(allocations) == ["n1/0-2,5", "n2/3"]
    assert gpu_list(parts) == ["n3/0 · 1g.10gb", "n3/1 · share 250/1000"]


def test_leases_and_orders_are_paged_and_the_poll_keeps_the_page(tenant_web, tenant, provider):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    for _ in range(27):
        Lease.objects.create(tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
                             gpu_count=1, price_micros=1, max_price_micros=1,
                             starts_at=now, ends_at=now + timedelta(hours=1), state="completed")
    first = tenant_web.get("/app/").content.decode()
    second = tenant_web.get("/app/?leases=2").content.decode()

    assert first.count("data-lease=") == 25 and second.count("data-lease=") == 2
    assert 'href="?leases=2" rel="next"' in first
    assert 'hx-get="/app/activity/?leases=2"' in second
    assert tenant_web.get("/app/activity/?leases=2").content.decode().count("data-lease=") == 2


def test_a_reserved_window_beyond_the_horizon_is_refused_next_to_the_field(tenant_web, tenant,
                                                                           provider):
    from market.models import Order

    response = tenant_web.post("/app/", {**ORDER, "tier": "reserved",
                                         "start_earliest": "9999-01-01T00:00",
                                         "start_latest": "9999-01-02T00:00"})

    assert response.status_code == 400
    assert "must begin within 90 days" in response.content.decode()
    assert not Order.objects.exists()


def test_a_share_of_a_gpu_is_ordered_from_the_form_and_the_lease_says_which_part(
        tenant_web, tenant, provider):
    prices.set_prices(provider=provider, scope={"gpu_model": "H100-80GB"},
                      price_micros=2_000_000, actor="test", shareable=True)

    response = tenant_web.post("/app/", {**ORDER, "gpus": "1", "level": "",
                                         "gpu_share": "250", "max_price": "1.00"})

    assert response.status_code == 302
    lease = Lease.objects.get(tenant=tenant)
    assert (lease.gpu_share, lease.price_micros) == (250, 500_000)
    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()
    assert "1 × share 250/1000 of H100-80GB" in page
    assert "· share 250/1000</div>" in page and "Price / share-h" in page


def test_a_share_and_a_slice_at_once_is_shown_next_to_its_field(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**ORDER, "gpus": "1", "level": "",
                                         "gpu_share": "250", "mig_profile": "1g.10gb"})

    assert response.status_code == 400
    assert 'id="id_gpu_share_error"' in response.content.decode()
    assert not Order.objects.exists()

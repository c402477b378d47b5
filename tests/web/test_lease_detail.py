import re
from datetime import timedelta

from django.utils import timezone

from market.models import Lease, Order
from tests.web.conftest import person
from tests.web.test_dashboard import ORDER

RESTING = {**ORDER, "max_price": "1.00", "fill": "rest", "idempotency_key": "k-rest"}


def _lease(tenant_web, tenant) -> Lease:
    tenant_web.post("/app/", ORDER)
    return Lease.objects.get(tenant=tenant)


def test_the_dashboard_links_each_lease_to_its_page(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)

    assert f'href="/app/leases/{lease.pk}/"' in tenant_web.get("/app/activity/").content.decode()


def test_the_lease_page_shows_gpus_locality_price_history_and_sla(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)

    response = tenant_web.get(f"/app/leases/{lease.pk}/")

    page = response.content.decode()
    assert response.status_code == 200
    assert f"Lease #{lease.pk}" in page and "/0-7</div>" in page
    assert "1 leaf · 1 spine · 0 hops" in page and "$2.50" in page
    assert 'id="events"' in page and lease.events.last().reason in page
    assert 'id="sla"' in page and "Availability target" in page
    assert f'hx-get="/app/leases/{lease.pk}/"' in page
    assert "Being preempted" not in page


def test_another_tenants_lease_is_not_found(client, tenant_web, tenant, provider):
    from ibex.accounts import services as accounts

    lease = _lease(tenant_web, tenant)
    rival = accounts.create_organization(slug="rival-labs", roles=("tenant",))
    client.force_login(person("rita-rival", rival))

    assert client.get(f"/app/leases/{lease.pk}/").status_code == 404
    assert client.post(f"/app/leases/{lease.pk}/extend/", {"hours": "1"}).status_code == 404
    lease.refresh_from_db()
    assert not lease.events.filter(kind="extended").exists()


def test_a_preempting_lease_counts_down_to_its_preemption(tenant_web, tenant, provider,
                                                          time_machine):
    lease = _lease(tenant_web, tenant)
    now = timezone.now()
    time_machine.move_to(now, tick=False)  # the countdown is read at one instant
    Lease.objects.filter(pk=lease.pk).update(
        state="preempting", preempt_at=now + timedelta(minutes=4, seconds=30))

    page = tenant_web.get(f"/app/leases/{lease.pk}/", HTTP_HX_REQUEST="true").content.decode()

    assert "Being preempted" in page and "data-deadline=" in page
    assert "4 min 30 s" in page


def test_extending_through_htmx_answers_the_lease_with_a_message(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)
    ends = lease.ends_at

    response = tenant_web.post(f"/app/leases/{lease.pk}/extend/", {"hours": "3"},
                               HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease")

    lease.refresh_from_db()
    page = response.content.decode()
    assert lease.ends_at == ends + timedelta(hours=3)
    assert f"Lease {lease.pk} extended by 3 h" in page and 'id="events"' in page
    assert "extended by 3 h to" in page  # the new event in the history


def test_a_bad_extension_says_why(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)

    page = tenant_web.post(f"/app/leases/{lease.pk}/extend/", {"hours": "0"},
                           HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease").content.decode()
    assert "extend by a whole number of hours" in page

    tenant_web.post(f"/app/leases/{lease.pk}/terminate/", {"next": "lease"})
    response = tenant_web.post(f"/app/leases/{lease.pk}/extend/", {"hours": "1", "next": "lease"})
    assert response["Location"] == f"/app/leases/{lease.pk}/"
    page = tenant_web.get(response["Location"]).content.decode()
    assert "not extended: a terminated lease cannot be extended" in page


def test_terminating_from_the_lease_page_answers_the_lease(tenant_web, tenant, provider):
    lease = _lease(tenant_web, tenant)

    response = tenant_web.post(f"/app/leases/{lease.pk}/terminate/", {"next": "lease"},
                               HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease")

    lease.refresh_from_db()
    page = response.content.decode()
    assert lease.state == "terminated"
    assert f"Lease {lease.pk} terminated." in page and "Terminate lease" not in page
    again = tenant_web.post(f"/app/leases/{lease.pk}/terminate/", {"next": "lease"},
                            HTTP_HX_REQUEST="true", HTTP_HX_TARGET="lease").content.decode()
    assert "a terminated lease cannot become terminated" in again


def test_a_resting_order_is_cancelled_from_the_dashboard(tenant_web, tenant, provider):
    from billing.services import balances_of

    tenant_web.post("/app/", RESTING)
    order = Order.objects.get(tenant=tenant)
    assert order.state == "resting" and balances_of(tenant).held_micros > 0
    assert f'/app/orders/{order.pk}/cancel/' in tenant_web.get("/app/activity/").content.decode()

    page = tenant_web.post(f"/app/orders/{order.pk}/cancel/",
                           HTTP_HX_REQUEST="true").content.decode()

    order.refresh_from_db()
    assert order.state == "cancelled" and balances_of(tenant).held_micros == 0
    assert f"Order {order.pk} cancelled" in page and 'id="orders"' in page
    again = tenant_web.post(f"/app/orders/{order.pk}/cancel/",
                            HTTP_HX_REQUEST="true").content.decode()
    assert "not cancelled: a cancelled order cannot be cancelled" in again


def test_another_tenants_order_cannot_be_cancelled(client, tenant_web, tenant, provider):
    from ibex.accounts import services as accounts

    tenant_web.post("/app/", RESTING)
    order = Order.objects.get(tenant=tenant)
    rival = accounts.create_organization(slug="rival-labs", roles=("tenant",))
    client.force_login(person("rita-rival", rival))

    assert client.post(f"/app/orders/{order.pk}/cancel/").status_code == 404
    order.refresh_from_db()
    assert order.state == "resting"


def test_countdown_text():
    from web.views_lease import countdown

    assert countdown(-1) == "now"
    assert countdown(65) == "1 min 05 s"
    assert countdown(3 * 3600 + 61) == "3 h 01 min 01 s"


def test_the_order_forms_planned_moves_box_is_ticked_by_default_only_for_spot(tenant_web):
    page = tenant_web.get("/app/").content.decode()

    box = re.search(r'<input type="checkbox" name="allow_moves"[^>]*>', page).group(0)
    assert "checked" not in box  # the form opens on on-demand
    assert 'src="/static/web/allow_moves.js"' in page


def test_a_lease_shows_whether_its_tenant_allows_planned_moves(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**ORDER, "allow_moves": "on", "idempotency_key": "k-moves"})
    moved = Lease.objects.get(tenant=tenant)
    tenant_web.post("/app/", {**ORDER, "gpus": "8", "idempotency_key": "k-still"})
    still = Lease.objects.exclude(pk=moved.pk).get(tenant=tenant)

    assert (moved.allow_moves, still.allow_moves) == (True, False)
    assert re.search(r'id="allow-moves"><span class="badge badge-ok">allowed<',
                     tenant_web.get(f"/app/leases/{moved.pk}/").content.decode())
    assert re.search(r'id="allow-moves"><span class="badge badge-muted">not allowed<',
                     tenant_web.get(f"/app/leases/{still.pk}/").content.decode())


def test_a_pool_lease_names_its_queue(tenant_web, tenant, campus_pool):
    from tests.scheduler.pools.builders import run

    lease, = run(tenant, campus_pool, 8)

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert "Pool queue</dt><dd><code>acme-train</code>" in page


def test_a_terminated_lease_shows_when_it_ended_not_its_planned_end(tenant_web, tenant,
                                                                    provider, time_machine):
    from market import leasing

    lease = _lease(tenant_web, tenant)
    time_machine.move_to(lease.created_at + timedelta(minutes=20), tick=False)
    leasing.terminate_lease(lease=lease, actor="acme-ai")
    lease.refresh_from_db()

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    ended = timezone.localtime(lease.state_changed_at)
    assert f'<dt>Ended</dt><dd id="lease-ends">{ended:%b %-d %Y, %H:%M}' in page
    assert "(planned " in page


def test_the_first_event_says_how_the_lease_was_won_and_dates_have_a_year(tenant_web, tenant,
                                                                        provider):
    lease = _lease(tenant_web, tenant)

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert lease.events.first().reason == f"order {lease.order.pk} matched at posted prices"
    assert f"{timezone.localtime(lease.starts_at):%b %-d %Y}" in page


def test_amounts_on_pages_are_to_the_cent():
    from web.templatetags.web_tags import dollars

    assert dollars(48_777_123_456) == "$48,777.12"
    assert dollars(2_500_000) == "$2.50"
    assert dollars(33_333) == "$0.03" and dollars(4_000) == "<$0.01" and dollars(0) == "$0.00"
    assert dollars(-1_235_000) == "-$1.24"

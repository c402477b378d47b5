"""A tenant registers a webhook endpoint on the web (the secret shown once), pauses it, reads the
delivery log and its events, and sends a failed delivery again."""

from datetime import timedelta

from django.utils import timezone

from market.models import Lease
from notify.models import Event, WebhookDelivery, WebhookEndpoint
from tests.factories import make_org


def an_event(tenant, n=1):
    now = timezone.now()
    lease = Lease.objects.create(tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
                                 gpu_count=8, price_micros=1, max_price_micros=1, starts_at=now,
                                 ends_at=now + timedelta(hours=1))
    return [Event.objects.create(tenant=tenant, lease=lease, kind="lease.started",
                                 source=f"lease_event:{i}", occurred_at=now) for i in range(n)]


def test_the_secret_is_shown_once(tenant_web, tenant):
    response = tenant_web.post("/app/webhooks/", {"url": "https://hooks.acme.test/ibex",
                                                  "description": "pager"})

    endpoint = WebhookEndpoint.objects.get(tenant=tenant)
    assert response["Location"] == "/app/webhooks/"
    first = tenant_web.get("/app/webhooks/").content.decode()
    assert endpoint.secret in first and endpoint.secret.startswith("whsec_")
    assert endpoint.secret not in tenant_web.get("/app/webhooks/").content.decode()


def test_a_bad_url_is_refused_next_to_the_field(tenant_web, tenant):
    response = tenant_web.post("/app/webhooks/", {"url": "ftp://hooks.acme.test/"})

    assert response.status_code == 400
    assert '<p class="error" id="id_url_error">Webhook URLs use https.</p>' in (
        response.content.decode())
    assert not WebhookEndpoint.objects.exists()


def test_an_endpoint_is_paused_and_deleted(tenant_web, tenant):
    tenant_web.post("/app/webhooks/", {"url": "https://hooks.acme.test/ibex"})
    endpoint = WebhookEndpoint.objects.get()

    tenant_web.post(f"/app/webhooks/{endpoint.pk}/toggle/")
    endpoint.refresh_from_db()
    assert endpoint.active is False
    tenant_web.post(f"/app/webhooks/{endpoint.pk}/delete/")
    assert not WebhookEndpoint.objects.exists()


def test_a_rival_cannot_touch_another_tenants_endpoint(client, tenant, db):
    from tests.web.conftest import person

    endpoint = WebhookEndpoint.objects.create(tenant=tenant, url="https://a.test/", secret="s")
    rival = make_org("rival-ai", "tenant")
    client.force_login(person("rita", rival))

    assert client.post(f"/app/webhooks/{endpoint.pk}/delete/").status_code == 404
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


def test_the_log_and_events_are_paged_and_a_failed_delivery_is_sent_again(tenant_web, tenant):
    endpoint = WebhookEndpoint.objects.create(tenant=tenant, url="https://a.test/", secret="s")
    events = an_event(tenant, n=23)
    now = timezone.now()
    for i, event in enumerate(events):
        WebhookDelivery.objects.create(endpoint=endpoint, event=event, next_attempt_at=now,
                                       state="failed" if i == 22 else "succeeded",
                                       attempts=3, status_code=500 if i == 22 else 200)
    failed = WebhookDelivery.objects.get(state="failed")

    page = tenant_web.get("/app/webhooks/").content.decode()
    older = tenant_web.get("/app/webhooks/?events=2").content.decode()
    tenant_web.post(f"/app/webhooks/deliveries/{failed.pk}/redeliver/")

    assert page.count("data-delivery=") == 20 and "HTTP 500" in page
    assert 'href="?events=2#events-card"' in page
    assert older.count("<code>lease.started</code></td><td><a") == 3
    failed.refresh_from_db()
    assert failed.state == "pending"

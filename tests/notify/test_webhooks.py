"""Webhook endpoints and deliveries, against a real HTTP receiver on 127.0.0.1."""

import hashlib
import hmac
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from ibex.celery import app as celery_app
from notify import events, webhooks
from notify.models import Event, WebhookAttempt, WebhookDelivery
from tests.factories import client_for
from tests.scheduler.sla_builders import funded_tenant, priced_provider, won_lease


class Receiver:
    """A tenant's webhook receiver: records every request, answers the queued statuses (then
    200)."""

    def __init__(self):
        self.received: list[tuple[dict, bytes]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.received.append((dict(self.headers), body))
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.end_headers()
                self.wfile.write(b"thanks")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/ibex-hook"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(loopback_webhooks):
    """A receiver on this machine (which the operator's exception list lets through)."""
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture
def tenant(db):
    return funded_tenant()


@pytest.fixture
def rival_tenant(db):
    return funded_tenant("rival-labs")


@pytest.fixture
def lease(db, tenant):
    priced_provider()
    return won_lease(tenant)


def register(tenant, url):
    response = client_for(tenant).post("/api/v1/webhooks/", {"url": url}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def an_event(lease, n=1) -> Event:
    return events.record_event(lease=lease, kind=Event.Kind.STARTED, source=f"test:{n}",
                               occurred_at=timezone.now(), payload={"lease": lease.pk, "n": n})


def deliver_all(now):
    return [webhooks.deliver(delivery_id=pk, now=now) for pk in webhooks.fan_out(now=now)]


# --- endpoints ------------------------------------------------------------------------------------


def test_registering_an_endpoint_shows_its_secret_once(tenant):
    client = client_for(tenant)

    created = register(tenant, "https://hooks.acme.example/ibex")
    shown = client.get(f"/api/v1/webhooks/{created['id']}/").json()
    listed = client.get("/api/v1/webhooks/").json()["results"]

    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    assert "secret" not in shown and "secret" not in listed[0]
    assert shown["url"] == "https://hooks.acme.example/ibex" and shown["active"] is True


@pytest.mark.parametrize("url", ["ftp://hooks.acme.example/ibex", "javascript:alert(1)",
                                 "hooks.acme.example/ibex", "https://", "http://me:pw@acme.example/"])
def test_only_http_and_https_urls_are_accepted(tenant, url):
    response = client_for(tenant).post("/api/v1/webhooks/", {"url": url}, format="json")

    assert response.status_code == 400
    assert "url" in response.json()["error"]["fields"]
    assert not tenant.webhook_endpoints.exists()


def test_a_rival_can_neither_see_nor_change_nor_delete_your_endpoint(tenant, rival_tenant):
    endpoint = register(tenant, "https://hooks.acme.example/ibex")
    rival = client_for(rival_tenant)
    path = f"/api/v1/webhooks/{endpoint['id']}/"

    assert rival.get("/api/v1/webhooks/").json()["results"] == []
    assert rival.get(path).status_code == 404
    assert rival.patch(path, {"active": False}, format="json").status_code == 404
    assert rival.delete(path).status_code == 404
    assert tenant.webhook_endpoints.get().active is True


def test_a_paused_endpoint_gets_nothing_and_a_deleted_one_is_gone(lease, tenant, receiver):
    endpoint = register(tenant, receiver.url)
    client = client_for(tenant)
    paused = client.patch(f"/api/v1/webhooks/{endpoint['id']}/", {"active": False},
                          format="json")
    an_event(lease)

    assert paused.json()["active"] is False
    assert deliver_all(timezone.now()) == [] and receiver.received == []
    assert client.delete(f"/api/v1/webhooks/{endpoint['id']}/").status_code == 204
    assert not tenant.webhook_endpoints.exists()


# --- deliveries -----------------------------------------------------------------------------------


def test_each_delivery_is_signed_with_the_endpoint_secret(lease, tenant, receiver):
    secret = register(tenant, receiver.url)["secret"]
    event = an_event(lease)
    now = timezone.now()

    assert [o.state for o in deliver_all(now)] == ["succeeded"]

    headers, body = receiver.received[0]
    fields = dict(part.split("=", 1) for part in headers["IBEX-Signature"].split(","))
    expected = hmac.new(secret.encode(), f"{fields['t']}.".encode() + body,
                        hashlib.sha256).hexdigest()
    assert hmac.compare_digest(fields["v1"], expected)
    assert int(fields["t"]) == int(now.timestamp())
    assert webhooks.verify(secret, body, headers["IBEX-Signature"], now=int(now.timestamp()))
    assert not webhooks.verify("whsec_wrong", body, headers["IBEX-Signature"],
                               now=int(now.timestamp()))
    assert json.loads(body) == {"id": event.pk, "kind": "lease.started", "lease": lease.pk,
                                "occurred_at": event.occurred_at.isoformat(),
                                "created_at": event.created_at.isoformat(),
                                "payload": {"lease": lease.pk, "n": 1}}
    assert headers["IBEX-Event-Id"] == str(event.pk)


def test_a_receiver_that_answers_500_is_retried_with_exponential_backoff(lease, tenant,
                                                                          receiver):
    register(tenant, receiver.url)
    an_event(lease)
    receiver.statuses = [500, 500]
    now = timezone.now()

    first = deliver_all(now)
    too_early = deliver_all(now + timedelta(seconds=9))
    second = deliver_all(now + timedelta(seconds=10))
    third = deliver_all(now + timedelta(seconds=30))

    assert [(o.state, o.status_code, o.retry_in) for o in first] == [
        ("pending", 500, timedelta(seconds=10))]
    assert too_early == []
    assert [(o.state, o.retry_in) for o in second] == [("pending", timedelta(seconds=20))]
    assert [o.state for o in third] == ["succeeded"]
    delivery = WebhookDelivery.objects.get()
    assert (delivery.attempts, delivery.status_code, delivery.error) == (3, 200, "")
    assert list(WebhookAttempt.objects.values_list("number", "status_code")) == [
        (1, 500), (2, 500), (3, 200)]
    assert len(receiver.received) == 3


def test_a_receiver_that_answered_200_gets_each_event_once(lease, tenant, receiver):
    register(tenant, receiver.url)
    an_event(lease, 1)
    an_event(lease, 2)
    now = timezone.now()

    deliver_all(now)
    deliver_all(now + timedelta(hours=1))
    delivery = WebhookDelivery.objects.first()
    replay = webhooks.deliver(delivery_id=delivery.pk, now=now + timedelta(hours=2))

    assert replay is None
    assert sorted(json.loads(body)["payload"]["n"] for _, body in receiver.received) == [1, 2]
    assert set(WebhookDelivery.objects.values_list("state", flat=True)) == {"succeeded"}


def test_two_workers_claiming_one_delivery_send_it_once(lease, tenant):
    register(tenant, "https://hooks.acme.example/ibex")
    an_event(lease)
    now = timezone.now()
    [delivery_id] = webhooks.fan_out(now=now)

    first = webhooks.claim(delivery_id=delivery_id, now=now)
    second = webhooks.claim(delivery_id=delivery_id, now=now)

    assert first is not None and second is None
    assert WebhookDelivery.objects.get().attempts == 1


def test_an_unreachable_receiver_is_given_up_after_the_last_attempt(lease, tenant, settings,
                                                                    loopback_webhooks):
    settings.WEBHOOK_MAX_ATTEMPTS = 2
    closed = Receiver()
    url = closed.url
    closed.close()
    register(tenant, url)
    an_event(lease)
    now = timezone.now()

    first = deliver_all(now)
    last = deliver_all(now + timedelta(seconds=10))

    assert [o.state for o in first] == ["pending"] and [o.state for o in last] == ["failed"]
    delivery = WebhookDelivery.objects.get()
    assert delivery.error.startswith("ConnectionError")
    assert deliver_all(now + timedelta(days=1)) == []


def test_backoff_doubles_up_to_an_hour():
    assert [webhooks.backoff(n).total_seconds() for n in (1, 2, 3, 4, 12)] == [
        10, 20, 40, 80, 3600]


def test_an_endpoint_registered_later_gets_only_later_events(lease, tenant, receiver):
    an_event(lease, 1)
    register(tenant, receiver.url)
    an_event(lease, 2)

    deliver_all(timezone.now())

    assert [json.loads(body)["payload"]["n"] for _, body in receiver.received] == [2]


def test_the_delivery_log_lists_attempts_of_your_endpoint(lease, tenant, receiver):
    endpoint = register(tenant, receiver.url)
    receiver.statuses = [503]
    an_event(lease)
    deliver_all(timezone.now())

    log = client_for(tenant).get(f"/api/v1/webhooks/{endpoint['id']}/deliveries/").json()

    assert [(d["event_kind"], d["state"], d["attempts"], d["status_code"])
            for d in log["results"]] == [("lease.started", "pending", 1, 503)]


def test_events_are_delivered_by_the_celery_task_after_commit(
        lease, tenant, receiver, django_capture_on_commit_callbacks):
    register(tenant, receiver.url)
    eager = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            an_event(lease)
            assert receiver.received == []  # nothing leaves before the commit
    finally:
        celery_app.conf.task_always_eager = eager

    assert len(callbacks) == 1
    assert len(receiver.received) == 1
    assert WebhookDelivery.objects.get().state == "succeeded"

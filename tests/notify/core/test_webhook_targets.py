"""Webhooks never reach the internal network: the address check on its own (examples only, no
traffic), then real deliveries to a receiver on loopback, refused by default and let through
only by the operator's exception list. Nothing here sends a packet off loopback."""

import pytest
from django.utils import timezone

from notify import webhooks
from notify.core import webhook_targets
from notify.core.webhook_targets import RefusedTarget, check_url, parse_networks, why_forbidden
from notify.models import WebhookDelivery
from tests.factories import client_for
from tests.notify.test_webhooks import Receiver, an_event, deliver_all, register
from tests.scheduler.sla_builders import funded_tenant, priced_provider, won_lease


@pytest.fixture
def tenant(db):
    return funded_tenant()


@pytest.fixture
def lease(tenant):
    priced_provider()
    return won_lease(tenant)


@pytest.mark.parametrize("address", [
    "127.0.0.1", "127.8.9.10", "::1", "10.0.0.1", "172.16.5.4", "192.168.1.1",
    "169.254.169.254", "fe80::1", "100.64.0.1", "0.0.0.0", "224.0.0.1", "ff02::1",
    "240.0.0.1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "fc00::1", "192.0.2.10"])
def test_internal_and_reserved_addresses_are_forbidden(address):
    assert why_forbidden(address) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700:4700::1111", "93.184.215.14"])
def test_public_addresses_are_allowed(address):
    assert why_forbidden(address) is None


def test_the_exception_list_lets_a_chosen_network_through():
    allowed = parse_networks("127.0.0.1/32, 10.8.0.0/16")

    assert why_forbidden("127.0.0.1", allowed) is None
    assert why_forbidden("10.8.3.4", allowed) is None
    assert why_forbidden("10.9.0.1", allowed) is not None
    with pytest.raises(ValueError, match="not a network: 'ten'"):
        parse_networks("ten")


def test_a_name_that_resolves_to_a_private_address_is_refused():
    def resolver(host, port):
        return {"hooks.internal.example": ["93.184.215.14", "10.1.2.3"]}[host]

    with pytest.raises(RefusedTarget, match="10.1.2.3 is a private address"):
        check_url("https://hooks.internal.example/x", resolve=resolver)


def test_a_public_name_resolves_to_checked_addresses():
    target = check_url("https://hooks.acme.example:8443/x",
                       resolve=lambda host, port: ["93.184.215.14"])

    assert (target.host, target.port, target.addresses) == (
        "hooks.acme.example", 8443, ("93.184.215.14",))


@pytest.mark.parametrize("url, why", [
    ("http://hooks.acme.example/x", "Webhook URLs use https."),
    ("https://localhost/x", "127.0.0.1 is a loopback address"),
    ("https://[::1]/x", "::1 is a loopback address"),
    ("https://hooks.acme.example:99999/x", "port"),
])
def test_urls_are_refused_before_any_resolution(url, why):
    with pytest.raises(RefusedTarget, match=why.replace(".", r"\.")):
        check_url(url, resolve=lambda host, port: ["93.184.215.14"])


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/admin/", "https://127.0.0.1/hook",
                                 "https://localhost:8443/hook", "https://[::1]/hook"])
def test_the_api_refuses_internal_urls_naming_the_field(tenant, url):
    response = client_for(tenant).post("/api/v1/webhooks/", {"url": url}, format="json")

    assert response.status_code == 400
    assert "url" in response.json()["error"]["fields"]
    assert not webhooks.WebhookEndpoint.objects.exists()


def test_the_web_form_refuses_a_loopback_url(tenant):
    from django.test import Client

    from tests.web.conftest import person

    web = Client()
    web.force_login(person("acme-owner", tenant))
    response = web.post("/app/webhooks/", {"url": "https://127.0.0.1:8000/admin/"})

    assert response.status_code == 400
    assert "127.0.0.1 is a loopback address" in response.content.decode()


@pytest.fixture
def receiver():
    """A receiver on loopback, with the operator's default rules (no exception) unless the test
    sets one."""
    receiver = Receiver()
    yield receiver
    receiver.close()


def test_a_loopback_receiver_gets_nothing_by_default(lease, tenant, settings, receiver):
    settings.WEBHOOK_ALLOW_HTTP = True  # even with http allowed, loopback is not
    with pytest.raises(webhooks.WebhookError, match="loopback"):
        webhooks.create_endpoint(tenant=tenant, url=receiver.url)
    settings.WEBHOOK_ALLOWED_NETWORKS = "127.0.0.1/32"
    register(tenant, receiver.url)  # registered while the operator allowed it ...
    settings.WEBHOOK_ALLOWED_NETWORKS = ""  # ... and refused at delivery once not
    an_event(lease)

    deliver_all(timezone.now())

    assert receiver.received == []
    delivery = WebhookDelivery.objects.get()
    assert delivery.error.startswith("refused: Webhooks are not sent to internal addresses")


def test_a_loopback_receiver_on_the_exception_list_gets_the_event(lease, tenant, settings,
                                                                  receiver):
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOWED_NETWORKS = "127.0.0.1/32"
    register(tenant, receiver.url)
    an_event(lease)

    deliver_all(timezone.now())

    assert len(receiver.received) == 1
    assert receiver.received[0][0]["Host"] == receiver.url.split("/")[2]


def test_a_name_that_resolves_to_loopback_at_delivery_is_refused(lease, tenant, settings,
                                                                   monkeypatch, receiver):
    """Registered while it did not resolve; at delivery it resolves to loopback: refused."""
    settings.WEBHOOK_ALLOW_HTTP = True
    register(tenant, receiver.url.replace("127.0.0.1", "rebind.acme.example"))
    monkeypatch.setattr(webhook_targets, "system_resolver", lambda host, port: ["127.0.0.1"])
    an_event(lease)

    deliver_all(timezone.now())

    assert receiver.received == []
    assert "127.0.0.1 is a loopback address" in WebhookDelivery.objects.get().error


def test_a_redirect_is_an_answer_not_a_new_destination(lease, tenant, settings, receiver):
    settings.WEBHOOK_ALLOW_HTTP = True
    settings.WEBHOOK_ALLOWED_NETWORKS = "127.0.0.1/32"
    receiver.statuses = [302]
    register(tenant, receiver.url)
    an_event(lease)

    deliver_all(timezone.now())

    assert len(receiver.received) == 1
    assert WebhookDelivery.objects.get().error == "HTTP 302"

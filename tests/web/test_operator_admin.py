"""The admin, shaped for operators: drain a node, suspend a provider, cancel a lease with a
refund (a reason asked on a confirmation page), and the lists operators search."""

import pytest
from django.contrib.auth import get_user_model

from billing.models import LedgerTransaction
from ibex.accounts.models import ProviderProfile
from market.models import Lease
from market.orders import OrderRequest, place_order
from pool.models import Node


@pytest.fixture
def operator_admin(client, db):
    olga = get_user_model().objects.create_superuser("olga-ops", password="a-long-passphrase-9")
    client.force_login(olga)
    return client


def a_lease(tenant):
    place_order(tenant=tenant, actor="test", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=8, hours=2, tier="on_demand",
        max_price_micros=3_000_000, topology={"required": "node"}))
    return Lease.objects.get(tenant=tenant)


def test_an_operator_drains_a_node(operator_admin, provider):
    node = Node.objects.filter(provider=provider).order_by("hostname").first()

    operator_admin.post("/admin/pool/node/", {"action": "drain", "_selected_action": [node.pk]})

    node.refresh_from_db()
    assert (node.state, node.drain_mode) == ("draining", "run_to_end")
    change = node.state_changes.last()
    assert (change.actor, change.reason) == ("olga-ops", "drained by an operator (run_to_end)")


def test_an_operator_suspends_a_provider(operator_admin, provider):
    profile = ProviderProfile.objects.get(organization=provider)

    operator_admin.post("/admin/accounts/providerprofile/",
                        {"action": "suspend", "_selected_action": [profile.pk]})

    profile.refresh_from_db()
    assert profile.state == "suspended"


def test_cancelling_a_lease_asks_for_a_reason_first(operator_admin, tenant, provider):
    lease = a_lease(tenant)

    page = operator_admin.post("/admin/market/lease/", {"action": "cancel_with_refund",
                                                        "_selected_action": [lease.pk]})

    assert page.status_code == 200
    assert "Cancel and refund" in page.content.decode()
    lease.refresh_from_db()
    assert lease.state != "terminated"


def test_an_operator_cancels_a_lease_with_a_refund(operator_admin, tenant, provider):
    lease = a_lease(tenant)

    page = operator_admin.post("/admin/market/lease/", {
        "action": "cancel_with_refund", "_selected_action": [lease.pk], "apply": "yes",
        "reason": "hardware fault at the provider"}, follow=True).content.decode()

    lease.refresh_from_db()
    assert lease.state == "terminated"
    assert lease.events.last().reason == "cancelled by an operator: hardware fault at the provider"
    assert f"Lease {lease.pk} terminated; nothing was charged for it" in page
    assert not LedgerTransaction.objects.filter(source_type="lease_refund").exists()


@pytest.mark.parametrize("path", ["/admin/market/lease/", "/admin/market/order/",
                                  "/admin/market/clearing/", "/admin/billing/payout/",
                                  "/admin/pool/node/", "/admin/accounts/providerprofile/"])
def test_operator_lists_search_and_filter(operator_admin, tenant, provider, path):
    a_lease(tenant)

    response = operator_admin.get(path, {"q": "acme"})

    assert response.status_code == 200
    assert 'id="changelist-search"' in response.content.decode()


def test_the_node_list_shows_leaf_gpus_and_unhealthy_gpus(operator_admin, provider):
    node = Node.objects.filter(provider=provider).order_by("hostname").first()
    gpu = node.gpus.order_by("index").first()
    gpu.health = "failed"
    gpu.save(update_fields=["health"])

    page = operator_admin.get("/admin/pool/node/", {"q": node.hostname}).content.decode()

    assert '<td class="field-gpus">8</td>' in page
    assert '<td class="field-gpus_unhealthy">1</td>' in page
    assert f'<td class="field-leaf">{node.host.leaf}</td>' in page


def test_draining_from_the_admin_says_what_was_done(operator_admin, provider):
    from pool.models import Node

    node = Node.objects.filter(provider=provider).first()

    response = operator_admin.post("/admin/pool/node/", {
        "action": "drain_moving_leases", "_selected_action": [node.pk]}, follow=True)

    assert (f"1 node draining: no new leases, its leases move off: {node.hostname}"
            in response.content.decode())

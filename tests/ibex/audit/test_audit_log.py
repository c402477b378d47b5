"""The audit log: every operator action and money action, with who, what, when and from where;
written in the action's own transaction; read-only in the admin and in the database."""

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, InternalError, transaction

from billing import services as market
from ibex.accounts import services as accounts
from ibex.accounts.models import ProviderProfile
from ibex.audit.models import AuditEntry
from pool.models import Node
from tests.factories import client_for, fund, make_org
from tests.market.inventory import provider_with_nodes

OPERATOR_IP = "203.0.113.7"


@pytest.fixture
def operator_web(client, db):
    olga = get_user_model().objects.create_superuser("olga", "olga@ibex.example", "pw")
    client.force_login(olga)
    return client


def test_an_operator_granting_credit_in_the_admin_is_recorded_with_who_and_where(operator_web):
    tenant = make_org("acme-ai", "tenant")

    operator_web.post("/admin/billing/creditgrant/add/", {
        "organization": tenant.pk, "amount": "25.50", "reason": "goodwill"},
        REMOTE_ADDR=OPERATOR_IP)

    entry = AuditEntry.objects.get(action="money.credit_grant")
    assert (entry.actor, entry.via, entry.ip) == ("olga", "admin", OPERATOR_IP)
    assert (entry.organization, entry.amount_micros) == ("acme-ai", 25_500_000)
    assert entry.details == {"reason": "goodwill"} and entry.at is not None
    # Django admin's own log of the same add is mirrored too.
    assert AuditEntry.objects.filter(action="admin.add", actor="olga",
                                     target_type="billing.creditgrant").exists()


def test_verifying_a_provider_in_the_admin_is_recorded(operator_web):
    provider = make_org("hpc-provider", "provider")
    profile = ProviderProfile.objects.get(organization=provider)

    operator_web.post("/admin/accounts/providerprofile/", {
        "action": "verify", "_selected_action": [profile.pk]}, REMOTE_ADDR=OPERATOR_IP)

    entry = AuditEntry.objects.get(action="provider.verified")
    assert (entry.actor, entry.ip, entry.organization) == ("olga", OPERATOR_IP, "hpc-provider")
    assert (entry.target_type, entry.target_id) == ("accounts.providerprofile", str(profile.pk))


def test_draining_a_node_through_the_api_names_the_key_and_address(db):
    provider = provider_with_nodes(nodes=2)
    node = Node.objects.filter(provider=provider).order_by("hostname").first()
    Node.objects.filter(pk=node.pk).update(state="active")
    client = client_for(provider, scopes=("read", "provide"))

    response = client.post(f"/api/v1/nodes/{node.pk}/drain/", {"reason": "maintenance"},
                           format="json", REMOTE_ADDR="198.51.100.20")

    assert response.status_code == 200, response.content
    entry = AuditEntry.objects.get(action="node.draining")
    assert entry.via.startswith("api key ") and entry.ip == "198.51.100.20"
    assert (entry.target_type, entry.target_id) == ("pool.node", str(node.pk))
    assert entry.details["from"] == "active"


def test_money_moved_by_stripe_and_tasks_is_recorded_as_theirs(db, settings):
    settings.STRIPE_API_KEY = "sk_test_ibex"
    tenant = make_org("acme-ai", "tenant")
    top_up = market.create_top_up(tenant=tenant, amount_micros=50_000_000)

    market.top_up_succeeded(top_up_id=top_up.pk, payment_intent_id="pi_1")

    requested, succeeded = AuditEntry.objects.order_by("id").filter(
        target_type="top_up", target_id=str(top_up.pk))
    assert (requested.action, requested.actor, requested.via) == (
        "money.top_up.requested", "system", "task")
    assert (succeeded.action, succeeded.actor, succeeded.amount_micros) == (
        "money.top_up.succeeded", "stripe", 50_000_000)


def test_an_action_that_rolls_back_leaves_no_entry(db):
    tenant = make_org("acme-ai", "tenant")

    with pytest.raises(RuntimeError), transaction.atomic():
        fund(tenant, "10")
        raise RuntimeError("the caller fails after the grant")

    assert not AuditEntry.objects.filter(action="money.credit_grant").exists()


def test_issuing_and_revoking_keys_are_recorded(db):
    tenant = make_org("acme-ai", "tenant")
    issued = accounts.issue_api_key(organization=tenant, scopes=["read"])

    accounts.revoke_api_key(api_key=issued.api_key)
    accounts.revoke_api_key(api_key=issued.api_key)  # twice: one revocation

    actions = list(AuditEntry.objects.filter(target_id=str(issued.api_key.pk),
                                             target_type="accounts.apikey")
                   .order_by("id").values_list("action", flat=True))
    assert actions == ["api_key.issue", "api_key.revoke"]


def test_the_admin_shows_the_log_but_cannot_add_change_or_delete(operator_web):
    entry = accounts.issue_api_key(organization=make_org("beta", "tenant"), scopes=["read"])
    row = AuditEntry.objects.get(target_id=str(entry.api_key.pk))

    assert operator_web.get("/admin/audit/auditentry/").status_code == 200
    assert operator_web.get(f"/admin/audit/auditentry/{row.pk}/change/").status_code == 200
    assert operator_web.get("/admin/audit/auditentry/add/").status_code == 403
    assert operator_web.post(f"/admin/audit/auditentry/{row.pk}/delete/",
                             {"post": "yes"}).status_code == 403
    assert operator_web.post(f"/admin/audit/auditentry/{row.pk}/change/",
                             {"actor": "someone else"}).status_code == 403
    assert AuditEntry.objects.get(pk=row.pk).actor == row.actor


def test_the_database_refuses_to_change_or_delete_an_entry(db):
    accounts.issue_api_key(organization=make_org("acme-ai", "tenant"), scopes=["read"])
    row = AuditEntry.objects.get(action="api_key.issue")

    for attempt in (lambda: AuditEntry.objects.filter(pk=row.pk).update(actor="x"),
                    lambda: AuditEntry.objects.filter(pk=row.pk).delete()):
        with pytest.raises((IntegrityError, InternalError)), transaction.atomic():
            attempt()
    assert AuditEntry.objects.get(pk=row.pk).actor == row.actor

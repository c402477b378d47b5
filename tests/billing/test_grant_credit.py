import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from billing.models import CreditGrant, Entry, LedgerTransaction
from tests.billing.conftest import balance


def test_an_operator_grants_credit_from_the_command_line(tenant, capsys):
    call_command("grant_credit", "--org", "acme-ai", "--amount", "100.00", "--reason",
                 "welcome credit")

    assert balance(tenant) == 100_000_000
    assert "granted 100.00 USD to acme-ai" in capsys.readouterr().out
    tx = LedgerTransaction.objects.get()
    assert (tx.cause, tx.source_type, tx.source_id) == ("grant", "credit_grant",
                                                        str(CreditGrant.objects.get().pk))
    assert tx.memo == "welcome credit"


@pytest.mark.parametrize("amount", ["-5", "0", "ten", "1e400"])
def test_a_bad_amount_grants_nothing(tenant, amount):
    with pytest.raises(CommandError):
        call_command("grant_credit", "--org", "acme-ai", "--amount", amount, "--reason", "x")
    assert Entry.objects.count() == 0


def test_an_unknown_organisation_is_named(db):
    with pytest.raises(CommandError, match="no organisation 'nobody'"):
        call_command("grant_credit", "--org", "nobody", "--amount", "1", "--reason", "x")


def test_an_operator_grants_credit_in_the_admin(tenant, client):
    operator = get_user_model().objects.create_superuser("olga", "olga@ibex.example", "pw")
    client.force_login(operator)

    response = client.post("/admin/billing/creditgrant/add/", {
        "organization": tenant.pk, "amount": "25.50", "reason": "goodwill: outage on 11-29"})

    assert response.status_code == 302
    assert balance(tenant) == 25_500_000
    assert CreditGrant.objects.get().actor == "olga"

import pytest
from django.db import IntegrityError, connection, transaction

from billing import ledger
from billing.ledger import InsufficientFunds, LedgerError, Line
from billing.models import Account, Entry, LedgerTransaction
from tests.billing.conftest import racing

Kind = Account.Kind


def test_a_balanced_transaction_moves_money_and_caches_both_balances(tenant):
    promotions = ledger.account(None, Kind.PROMOTIONS)
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)

    tx = ledger.move(from_account=promotions, to_account=available, amount_micros=5_000_000,
                     cause="grant", source_type="credit_grant", source_id=1, actor="test")

    assert sorted(tx.entries.values_list("amount_micros", flat=True)) == [-5_000_000, 5_000_000]
    assert ledger.balance(tenant, Kind.TENANT_AVAILABLE) == 5_000_000
    assert ledger.balance(None, Kind.PROMOTIONS) == -5_000_000
    assert ledger.derived_balance(available) == 5_000_000


def test_python_refuses_an_unbalanced_transaction(tenant):
    lines = [Line(ledger.account(None, Kind.PROMOTIONS), -5),
             Line(ledger.account(tenant, Kind.TENANT_AVAILABLE), 4)]
    with pytest.raises(LedgerError):
        ledger.post(cause="grant", source_type="test", source_id=1, actor="t", lines=lines)
    assert Entry.objects.count() == 0


def test_an_account_that_may_not_go_negative_refuses_and_nothing_is_written(tenant):
    with pytest.raises(InsufficientFunds):
        ledger.move(from_account=ledger.account(tenant, Kind.TENANT_AVAILABLE),
                    to_account=ledger.account(tenant, Kind.TENANT_HELD), amount_micros=1,
                    cause="hold", source_type="hold", source_id=1, actor="t")
    assert LedgerTransaction.objects.count() == 0


def test_the_database_refuses_a_negative_tenant_balance_even_from_raw_sql(tenant):
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE market_account SET balance_micros = -1 WHERE id = %s",
                       [available.pk])


def test_platform_accounts_belong_to_no_organisation(tenant):
    with pytest.raises(LedgerError):
        ledger.account(tenant, Kind.PLATFORM_REVENUE)
    with pytest.raises(LedgerError):
        ledger.account(None, Kind.TENANT_AVAILABLE)


def test_entries_are_append_only(tenant):
    ledger.move(from_account=ledger.account(None, Kind.PROMOTIONS),
                to_account=ledger.account(tenant, Kind.TENANT_AVAILABLE), amount_micros=10,
                cause="grant", source_type="test", source_id=1, actor="t")
    entry = Entry.objects.first()
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).update(amount_micros=20)
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        Entry.objects.filter(pk=entry.pk).delete()
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("UPDATE market_ledgertransaction SET memo = 'edited'")


@racing
def test_an_unbalanced_transaction_cannot_be_committed_even_with_raw_sql(tenant):
    promotions = ledger.account(None, Kind.PROMOTIONS)
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)

    with pytest.raises(IntegrityError, match="does not balance"):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("""INSERT INTO market_ledgertransaction
                              (cause, source_type, source_id, currency, memo, actor, created_at)
                              VALUES ('grant', 'raw', '1', 'usd', '', 'mallory', now())
                              RETURNING id""")
            tx_id = cursor.fetchone()[0]
            cursor.execute("""INSERT INTO market_entry (transaction_id, account_id, amount_micros,
                              created_at) VALUES (%s, %s, -100, now()), (%s, %s, 101, now())""",
                           [tx_id, promotions.pk, tx_id, available.pk])

    assert Entry.objects.count() == 0 and LedgerTransaction.objects.count() == 0


@racing
def test_a_single_sided_entry_cannot_be_committed(tenant):
    available = ledger.account(tenant, Kind.TENANT_AVAILABLE)
    with pytest.raises(IntegrityError), transaction.atomic():
        tx = LedgerTransaction.objects.create(cause="grant", source_type="raw", source_id="1",
                                              actor="mallory")
        Entry.objects.create(transaction=tx, account=available, amount_micros=100)
    assert Entry.objects.count() == 0


def test_posting_locks_the_accounts_in_ascending_id_order(tenant, provider):
    from django.db import connection as conn
    from django.test.utils import CaptureQueriesContext

    accounts = [ledger.account(provider, Kind.PROVIDER_PAYABLE),
                ledger.account(None, Kind.PLATFORM_REVENUE),
                ledger.account(tenant, Kind.TENANT_AVAILABLE),
                ledger.account(None, Kind.PROMOTIONS)]
    lines = [Line(accounts[3], -30), Line(accounts[2], 10), Line(accounts[1], 10),
             Line(accounts[0], 10)]

    with CaptureQueriesContext(conn) as queries:
        ledger.post(cause="grant", source_type="test", source_id=1, actor="t", lines=lines)

    (locking,) = [q["sql"] for q in queries if "FOR UPDATE" in q["sql"]]
    assert 'ORDER BY "market_account"."id" ASC' in locking
    assert locking.index("SELECT") < locking.index("FOR UPDATE")

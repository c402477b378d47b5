"""The ledger: the only code that writes ledger rows.

Every movement of money is one `LedgerTransaction` whose entries sum to zero per currency
(PostgreSQL checks this at commit with a deferred constraint trigger, and refuses UPDATE and
DELETE of entries). Account balances are the sum of their entries, cached on the account row
and changed only here, under `SELECT ... FOR UPDATE` taken in ascending account id order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Sum

from billing.core.money import to_dollars
from billing.models import USD, Account, Entry, LedgerTransaction
from ibex.accounts.models import Organization

Kind = Account.Kind


class LedgerError(Exception):
    pass


class InsufficientFunds(LedgerError):
    def __init__(self, account: Account, needed_micros: int):
        self.account, self.needed_micros = account, needed_micros
        super().__init__(f"{account.kind.replace('_', ' ')} balance is {to_dollars(account.balance_micros)}"
                         f" {account.currency.upper()}, {to_dollars(needed_micros)} needed")


@dataclass(frozen=True)
class Line:
    account: Account
    amount_micros: int  # positive: the account's balance grows


def account(organization: Organization | None, kind: str, currency: str = USD) -> Account:
    """The account of this kind for an organisation (None: the platform), created on first use."""
    if (organization is None) != (kind in Account.PLATFORM_KINDS):
        raise LedgerError(f"{kind} accounts belong to {'the platform' if organization is None else 'organisations'}")
    found = Account.objects.filter(organization=organization, kind=kind, currency=currency).first()
    if found is not None:
        return found
    with transaction.atomic():
        found, _ = Account.objects.get_or_create(organization=organization, kind=kind,
                                                 currency=currency)
    return found


def lock(accounts: list[Account]) -> dict[int, Account]:
    """Lock account rows in ascending id order (the one lock order) and return them fresh."""
    ids = sorted({a.pk for a in accounts})
    return {a.pk: a for a in Account.objects.select_for_update().filter(pk__in=ids).order_by("pk")}


def post(*, cause: str, source_type: str, source_id: str | int, lines: list[Line], actor: str,
         memo: str = "") -> LedgerTransaction:
    """Write one balanced transaction and update the cached balances under lock.

    Raises InsufficientFunds, writing nothing, when an account that may not go negative
    would. Call it inside the caller's transaction; it opens a savepoint of its own.
    """
    lines = [line for line in lines if line.amount_micros != 0]
    if len(lines) < 2:
        raise LedgerError("a transaction needs at least two non-zero lines")
    currencies = {line.account.currency for line in lines}
    if len(currencies) != 1:
        raise LedgerError("one currency per transaction")
    if sum(line.amount_micros for line in lines) != 0:
        raise LedgerError("entries must sum to zero")
    with transaction.atomic():
        locked = lock([line.account for line in lines])
        change: dict[int, int] = defaultdict(int)
        for line in lines:
            change[line.account.pk] += line.amount_micros
        for account_id, delta in change.items():
            acc = locked[account_id]
            if acc.kind not in Account.MAY_GO_NEGATIVE and acc.balance_micros + delta < 0:
                raise InsufficientFunds(acc, -delta)
        tx = LedgerTransaction.objects.create(
            cause=cause, source_type=source_type, source_id=str(source_id),
            currency=currencies.pop(), memo=memo[:500], actor=actor[:150])
        Entry.objects.bulk_create([Entry(transaction=tx, account_id=line.account.pk,
                                         amount_micros=line.amount_micros) for line in lines])
        for account_id, delta in change.items():
            acc = locked[account_id]
            acc.balance_micros += delta
            acc.save(update_fields=["balance_micros"])
            for line in lines:
                if line.account.pk == account_id:
                    line.account.balance_micros = acc.balance_micros
    return tx


def move(*, from_account: Account, to_account: Account, amount_micros: int, cause: str,
         source_type: str, source_id: str | int, actor: str, memo: str = "") -> LedgerTransaction:
    """The common two-line transaction: `amount` leaves one account for another."""
    if amount_micros <= 0:
        raise LedgerError("move a positive amount")
    return post(cause=cause, source_type=source_type, source_id=source_id, actor=actor, memo=memo,
                lines=[Line(from_account, -amount_micros), Line(to_account, amount_micros)])


def balance(organization: Organization | None, kind: str, currency: str = USD) -> int:
    """The cached balance (0 when the account does not exist yet)."""
    found = Account.objects.filter(organization=organization, kind=kind,
                                   currency=currency).values_list("balance_micros", flat=True)
    return found.first() or 0


def derived_balance(acc: Account) -> int:
    """The balance recomputed from entries: what the cache must always equal."""
    return Entry.objects.filter(account=acc).aggregate(total=Sum("amount_micros"))["total"] or 0


def total_of_all_accounts() -> int:
    """The sum over every account of every entry: zero in a healthy ledger."""
    return Entry.objects.aggregate(total=Sum("amount_micros"))["total"] or 0

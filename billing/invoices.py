"""Monthly invoices for tenants and statements for providers, read from usage and the ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db.models import Count, F, Max, Sum

from billing.models import Account, Entry, LedgerTransaction, Payout, UsageRecord
from ibex.accounts.models import Organization

Cause = LedgerTransaction.Cause
Kind = Account.Kind


def month_bounds(month: date) -> tuple[datetime, datetime]:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = (datetime(month.year + 1, 1, 1, tzinfo=UTC) if month.month == 12
           else datetime(month.year, month.month + 1, 1, tzinfo=UTC))
    return start, end


def parse_month(text: str) -> date:
    """"2026-11" → date(2026, 11, 1); ValueError otherwise."""
    year, _, month = text.partition("-")
    if len(year) != 4 or len(month) != 2:
        raise ValueError("months are written YYYY-MM")
    return date(int(year), int(month), 1)


@dataclass(frozen=True)
class InvoiceLine:
    lease_ref: str
    gpu_hours: Decimal
    price_per_gpu_hour_micros: int
    amount_micros: int
    minutes: int


@dataclass(frozen=True)
class Invoice:
    organization: Organization
    month: date
    lines: list[InvoiceLine]
    credits: list[dict] = field(default_factory=list)  # {"cause", "memo", "amount_micros"}
    # money paid in (card top-ups, credit grants): not usage credits, so not in the total
    payments: list[dict] = field(default_factory=list)

    @property
    def usage_micros(self) -> int:
        return sum(line.amount_micros for line in self.lines)

    @property
    def credits_micros(self) -> int:
        return sum(c["amount_micros"] for c in self.credits)

    @property
    def total_micros(self) -> int:
        return self.usage_micros - self.credits_micros


def _gpu_hours(gpu_seconds: int) -> Decimal:
    return (Decimal(gpu_seconds) / 3600).quantize(Decimal("0.000001"))


def invoice_for(*, tenant: Organization, month: date) -> Invoice:
    start, end = month_bounds(month)
    rows = (UsageRecord.objects.filter(payer=tenant, minute__gte=start, minute__lt=end)
            .values("lease_ref")
            .annotate(amount=Sum("charge_micros"), minutes=Count("id"),
                      gpu_seconds=Sum(F("gpus") * F("seconds")),
                      price=Max("price_per_gpu_hour_micros"))
            .order_by("lease_ref"))
    lines = [InvoiceLine(lease_ref=row["lease_ref"], gpu_hours=_gpu_hours(row["gpu_seconds"]),
                         price_per_gpu_hour_micros=row["price"], amount_micros=row["amount"],
                         minutes=row["minutes"]) for row in rows]
    credits = _entries(tenant, start, end, [Cause.SLA_CREDIT])
    payments = _entries(tenant, start, end, [Cause.GRANT, Cause.TOP_UP])
    return Invoice(organization=tenant, month=month, lines=lines, credits=credits,
                   payments=payments)


def _entries(tenant: Organization, start, end, causes: list[str]) -> list[dict]:
    """The tenant's available-balance entries of these causes in [start, end)."""
    return [
        {"cause": e.transaction.cause, "memo": e.transaction.memo, "at": e.created_at,
         "amount_micros": e.amount_micros}
        for e in Entry.objects.filter(
            account__organization=tenant, account__kind=Kind.TENANT_AVAILABLE,
            transaction__cause__in=causes, created_at__gte=start, created_at__lt=end)
        .select_related("transaction").order_by("id")
    ]


@dataclass(frozen=True)
class Statement:
    organization: Organization
    month: date
    earnings_micros: int  # what tenants paid for this provider's GPUs
    fees_micros: int
    held_back_micros: int
    payouts: list[Payout]

    @property
    def net_micros(self) -> int:
        return self.earnings_micros - self.fees_micros - self.held_back_micros

    @property
    def paid_out_micros(self) -> int:
        return sum(p.amount_micros for p in self.payouts if p.state == Payout.State.PAID)


def statement_for(*, provider: Organization, month: date) -> Statement:
    start, end = month_bounds(month)
    totals = UsageRecord.objects.filter(payee=provider, minute__gte=start, minute__lt=end).aggregate(
        earnings=Sum("charge_micros"), fees=Sum("fee_micros"), held_back=Sum("held_back_micros"))
    payouts = list(Payout.objects.filter(provider=provider, created_at__gte=start,
                                         created_at__lt=end).order_by("id"))
    return Statement(organization=provider, month=month,
                     earnings_micros=totals["earnings"] or 0, fees_micros=totals["fees"] or 0,
                     held_back_micros=totals["held_back"] or 0, payouts=payouts)


def months_with_activity(*, organization: Organization) -> list[str]:
    """"YYYY-MM" of every month with usage paid or earned, or entries, newest first."""
    months = set()
    for side in ("payer", "payee"):
        months |= {m.strftime("%Y-%m") for m in UsageRecord.objects.filter(
            **{side: organization}).dates("minute", "month")}
    months |= {m.strftime("%Y-%m") for m in Entry.objects.filter(
        account__organization=organization).dates("created_at", "month")}
    return sorted(months, reverse=True)

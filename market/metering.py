"""Metering: every minute, each lease that served GPUs is billed for the seconds it ran.

Reads leases and allocations (trading) and bills through `billing.services.record_usage`,
once per (lease, provider, price) and minute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import OuterRef, Subquery

from billing.services import MoneyError, record_usage
from ibex import references
from ibex.accounts.models import Organization
from market.models import Allocation, LeaseEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningLease:
    """What metering needs to know about one provider's GPUs at one price in a lease."""

    ref: str
    payer: Organization
    payee: Organization
    price_per_gpu_hour_micros: int
    gpus: int
    started_at: datetime
    ended_at: datetime | None = None
    order_ref: str | None = None


BILLABLE_STATES = ("active", "preempting", "completed", "terminated", "preempted")


def running_leases(*, minute: datetime) -> list[RunningLease]:
    """Leases that served GPUs during the minute, one entry per (lease, provider, posted price).

    Billing starts when the lease became active (not while it was being placed) and stops
    where its allocations end (cut at termination or preemption).
    """
    end_of_minute = minute + timedelta(minutes=1)
    activated = LeaseEvent.objects.filter(lease=OuterRef("lease"), to_state="active").values("at")
    rows = (
        Allocation.objects.filter(lease__state__in=BILLABLE_STATES,
                                  period__overlap=(minute, end_of_minute))
        .annotate(activated_at=Subquery(activated[:1]))
        .filter(activated_at__isnull=False, activated_at__lt=end_of_minute)
        .values_list("lease_id", "lease__tenant_id", "gpu__node__provider_id", "price_micros",
                     "period", "activated_at", "lease__order__id")
    )
    groups: dict[tuple, dict] = {}
    for lease_id, tenant_id, provider_id, price, period, activated_at, order_id in rows:
        key = (lease_id, provider_id, price)
        group = groups.setdefault(key, {"tenant": tenant_id, "gpus": 0, "order": order_id,
                                        "start": max(period.lower, activated_at),
                                        "end": period.upper})
        group["gpus"] += 1
    orgs = Organization.objects.in_bulk({g["tenant"] for g in groups.values()}
                                        | {k[1] for k in groups})
    return [
        RunningLease(ref=f"{references.lease_ref(lease_id)}:{orgs[provider_id].slug}:{price}",
                     payer=orgs[g["tenant"]], payee=orgs[provider_id],
                     price_per_gpu_hour_micros=price, gpus=g["gpus"], started_at=g["start"],
                     ended_at=g["end"], order_ref=f"order-{g['order']}" if g["order"] else None)
        for (lease_id, provider_id, price), g in sorted(groups.items())
    ]


def seconds_in_minute(lease: RunningLease, minute: datetime) -> int:
    end_of_minute = minute + timedelta(minutes=1)
    start = max(lease.started_at, minute)
    end = min(lease.ended_at or end_of_minute, end_of_minute)
    return max(0, int((end - start).total_seconds()))


def meter_minute(*, minute: datetime) -> int:
    """Bill every running lease for one minute; safe to re-run (each lease, each minute once)."""
    minute = minute.replace(second=0, microsecond=0)
    billed = 0
    for lease in running_leases(minute=minute):
        try:
            record_usage(lease_ref=lease.ref, payer=lease.payer, payee=lease.payee,
                         price_per_gpu_hour_micros=lease.price_per_gpu_hour_micros,
                         gpus=lease.gpus, seconds=seconds_in_minute(lease, minute),
                         minute=minute, order_ref=lease.order_ref)
            billed += 1
        except MoneyError as exc:
            log.warning("could not bill lease %s for %s: %s", lease.ref, minute, exc.message)
    return billed

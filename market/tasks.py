"""Celery tasks for trading: metering, auction clearing, resting orders and lease ends.

Thin wrappers around `market` services; the names are the wire contract of the queues.
"""

from datetime import datetime, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from market import auctions, leasing, metering, orders


@shared_task(name="market.meter_usage")
def meter_usage(minute: str | None = None) -> int:
    """Bill one minute (ISO time), else the last METERING_CATCH_UP_MINUTES minutes that have
    ended (beat: once a minute). Billing is once per lease and minute, so a run that was
    lost (a worker killed, the beat late) is made up by the next one, not skipped."""
    if minute is not None:
        return metering.meter_minute(minute=datetime.fromisoformat(minute))
    last_minute = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=1)
    return sum(metering.meter_minute(minute=last_minute - timedelta(minutes=back))
               for back in reversed(range(settings.METERING_CATCH_UP_MINUTES)))


@shared_task(name="market.clear_markets")
def clear_markets() -> int:
    return len(auctions.clear_markets())


@shared_task(name="market.end_preempted_leases")
def end_preempted_leases() -> list[int]:
    return auctions.end_preempted_leases()


@shared_task(name="market.retry_resting_orders")
def retry_resting_orders() -> list[int]:
    return orders.retry_resting_orders()


@shared_task(name="market.complete_ended_leases")
def complete_ended_leases() -> list[int]:
    return leasing.complete_ended_leases()

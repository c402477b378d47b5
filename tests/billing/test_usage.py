from datetime import UTC, datetime, timedelta

import pytest

from billing import services
from billing.models import Account, Entry, UsageRecord
from market import metering, tasks
from market.metering import RunningLease
from tests.billing.conftest import balance, in_threads, racing
from tests.factories import fund

Kind = Account.Kind
MINUTE = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
H100 = 2_400_000  # 2.40 USD per GPU-hour


def bill(tenant, provider, *, lease_ref="lease-1", seconds=60, minute=MINUTE, gpus=8,
         order_ref=None):
    return services.record_usage(lease_ref=lease_ref, payer=tenant, payee=provider,
                                 price_per_gpu_hour_micros=H100, seconds=seconds, minute=minute,
                                 gpus=gpus, order_ref=order_ref)


def test_a_minute_of_usage_is_charged_per_second_and_split(tenant, provider):
    fund(tenant, "100.00")

    record = bill(tenant, provider, seconds=45)  # 8 GPUs × 45 s × 2.40 / 3600 = 0.24

    assert (record.charge_micros, record.fee_micros, record.held_back_micros) == (
        240_000, 24_000, 10_800)
    assert balance(tenant) == 99_760_000
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 205_200
    assert balance(provider, Kind.PROVIDER_HELD_BACK) == 10_800
    assert balance(None, Kind.PLATFORM_REVENUE) == 24_000
    tx = record.transaction
    assert (tx.cause, tx.source_type, tx.source_id) == ("usage", "usage", str(record.pk))


def test_the_commission_is_configurable(tenant, provider, settings):
    settings.MARKET_COMMISSION_BP = 2500
    settings.PROVIDER_HOLD_BACK_BP = 0
    fund(tenant, "100.00")

    record = bill(tenant, provider, gpus=1, seconds=60)  # 0.04

    assert (record.charge_micros, record.fee_micros) == (40_000, 10_000)
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 30_000


def test_billing_the_same_minute_twice_changes_nothing(tenant, provider):
    fund(tenant, "100.00")
    first = bill(tenant, provider)
    entries = Entry.objects.count()

    again = bill(tenant, provider, seconds=30, minute=MINUTE + timedelta(seconds=17))

    assert again.pk == first.pk and again.seconds == 60
    assert Entry.objects.count() == entries


def test_usage_is_captured_from_the_orders_hold_first(tenant, provider):
    fund(tenant, "100.00")
    services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=10_000_000)

    bill(tenant, provider, order_ref="order-1")  # 0.32

    assert balance(tenant, Kind.TENANT_HELD) == 9_680_000
    assert balance(tenant) == 90_000_000


def test_a_minute_with_no_seconds_is_recorded_without_moving_money(tenant, provider):
    record = bill(tenant, provider, seconds=0)
    assert record.charge_micros == 0 and record.transaction is None
    assert Entry.objects.count() == 0


def test_impossible_usage_is_refused(tenant, provider):
    for seconds in (-1, 61):
        with pytest.raises(services.MoneyError):
            bill(tenant, provider, seconds=seconds)
    assert not UsageRecord.objects.exists()


def test_a_tenant_without_money_is_not_billed_into_debt(tenant, provider):
    with pytest.raises(services.MoneyError, match="insufficient funds"):
        bill(tenant, provider)
    assert not UsageRecord.objects.exists() and Entry.objects.count() == 0


def test_seconds_in_a_minute_follow_the_lease_start_and_end(tenant, provider):
    lease = RunningLease(ref="l", payer=tenant, payee=provider, price_per_gpu_hour_micros=1,
                         gpus=1, started_at=MINUTE + timedelta(seconds=20),
                         ended_at=MINUTE + timedelta(seconds=50))
    assert metering.seconds_in_minute(lease, MINUTE) == 30
    assert metering.seconds_in_minute(lease, MINUTE + timedelta(minutes=1)) == 0
    assert metering.seconds_in_minute(lease, MINUTE - timedelta(minutes=1)) == 0


def test_the_beat_task_bills_the_minutes_that_ended_making_up_missed_ones(
        monkeypatch, settings, tenant, provider):
    settings.METERING_CATCH_UP_MINUTES = 3
    fund(tenant, "100.00")
    seen = []

    def leases(*, minute):
        seen.append(minute)
        return [RunningLease(ref="lease-1", payer=tenant, payee=provider,
                             price_per_gpu_hour_micros=H100, gpus=1,
                             started_at=minute - timedelta(hours=1))]

    monkeypatch.setattr(metering, "running_leases", leases)

    assert tasks.meter_usage() == 3
    last = seen[-1]
    assert last.second == 0 and last < datetime.now(UTC) - timedelta(seconds=59)
    assert seen == [last - timedelta(minutes=2), last - timedelta(minutes=1), last]
    assert [r.seconds for r in UsageRecord.objects.order_by("minute")] == [60, 60, 60]
    # The next run bills the three minutes again only where they are not billed yet.
    tasks.meter_usage()
    assert UsageRecord.objects.filter(minute__in=seen).count() == 3


def test_the_task_bills_one_named_minute(monkeypatch, tenant, provider):
    fund(tenant, "100.00")
    monkeypatch.setattr(metering, "running_leases", lambda *, minute: [RunningLease(
        ref="lease-1", payer=tenant, payee=provider, price_per_gpu_hour_micros=H100, gpus=1,
        started_at=minute - timedelta(hours=1))])

    assert tasks.meter_usage(minute=MINUTE.isoformat()) == 1
    assert UsageRecord.objects.get().minute == MINUTE


class WorkerDied(BaseException):
    pass


@racing
def test_a_metering_run_killed_midway_and_run_again_bills_each_minute_once(
        monkeypatch, tenant, provider):
    fund(tenant, "100.00")
    leases = [RunningLease(ref=f"lease-{n}", payer=tenant, payee=provider,
                           price_per_gpu_hour_micros=H100, gpus=1,
                           started_at=MINUTE - timedelta(hours=1)) for n in range(10)]

    def dies_after_four(*, minute):
        yield from leases[:4]
        raise WorkerDied

    monkeypatch.setattr(metering, "running_leases", dies_after_four)
    with pytest.raises(WorkerDied):
        metering.meter_minute(minute=MINUTE)
    assert UsageRecord.objects.count() == 4

    monkeypatch.setattr(metering, "running_leases", lambda *, minute: leases)
    metering.meter_minute(minute=MINUTE)
    metering.meter_minute(minute=MINUTE)

    assert UsageRecord.objects.count() == 10
    assert balance(tenant) == 100_000_000 - 10 * 40_000


@racing
def test_concurrent_metering_runs_bill_a_minute_once(tenant, provider):
    fund(tenant, "100.00")

    results = in_threads(8, lambda i: bill(tenant, provider, lease_ref="lease-1"))

    assert len({r.pk for r in results}) == 1
    assert UsageRecord.objects.count() == 1
    assert balance(tenant) == 100_000_000 - 320_000

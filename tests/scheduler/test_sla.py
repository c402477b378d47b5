"""SLA terms, measurement from health events, and automatic credits through the ledger.

The hand-worked case: 8 H100s for 10 h on demand at $2.50 per GPU-hour = 288 000 GPU-seconds.
"""

from datetime import timedelta

import pytest

from billing import ledger
from billing import services as money
from billing.models import LedgerTransaction
from notify.models import Event
from scheduler import sla
from scheduler.models import LeaseSla, SlaCredit
from tests.factories import client_for, make_org
from tests.scheduler.sla_builders import (
    HOUR,
    activate,
    end,
    funded_tenant,
    gpu_health,
    gpus_of,
    lease_gpus,
    meter,
    node_reachability,
    priced_provider,
    won_lease,
)


@pytest.fixture
def provider(db):
    return priced_provider()


@pytest.fixture
def tenant(db):
    return funded_tenant()


@pytest.fixture
def lease(provider, tenant):
    """8 GPUs for 10 h, active the moment it was won; 20 minutes billed ($6.66666)."""
    lease = activate(won_lease(tenant))
    meter(lease, 20)
    return lease


def available(org) -> int:
    return money.balances_of(org).available_micros


# --- terms ----------------------------------------------------------------------------------------


def test_an_on_demand_lease_is_promised_99_5_percent_and_activation_within_60_s(lease):
    terms = sla.ensure_sla(lease)

    assert (terms.tier, terms.availability_target_bp, terms.activation_limit_s) == (
        "on_demand", 9950, 60)
    assert terms.promised_locality == {}  # one node: no fabric locality to promise


def test_a_multi_node_lease_keeps_the_locality_it_was_sold_with(provider, tenant):
    lease = won_lease(tenant, gpus=16)

    terms = sla.ensure_sla(lease)

    assert terms.promised_locality == {"leaves": 1, "spines": 1, "max_hops": 2}
    assert sla.ensure_sla(lease).pk == terms.pk  # stored once


def test_the_sla_shows_whether_a_multi_node_lease_still_sits_as_close_as_promised(provider,
                                                                                tenant):
    from market.models import Allocation

    lease = activate(won_lease(tenant, gpus=16))
    client = client_for(tenant)
    kept = client.get(f"/api/v1/leases/{lease.pk}/sla/").json()["measurement"]
    moved = Allocation.objects.filter(lease=lease).order_by("id").first()
    far = next(g for g in gpus_of(provider)
               if g.node.host.leaf != moved.gpu.node.host.leaf)
    Allocation.objects.filter(pk=moved.pk).update(gpu=far)  # as a migration would

    broken = client.get(f"/api/v1/leases/{lease.pk}/sla/").json()["measurement"]

    assert kept["locality_now"] == {"leaves": 1, "spines": 1, "max_hops": 2}
    assert kept["locality_kept"] is True
    assert broken["locality_now"]["max_hops"] == 4 and broken["locality_kept"] is False


def test_reserved_promises_99_9_percent_and_spot_promises_nothing(provider, tenant):
    reserved = won_lease(tenant, tier="reserved")
    spot = won_lease(tenant, tier="spot")

    assert sla.ensure_sla(reserved).availability_target_bp == 9990
    assert (sla.ensure_sla(spot).availability_target_bp, sla.ensure_sla(spot).activation_limit_s
            ) == (None, None)


# --- availability credits -------------------------------------------------------------------------


def test_a_gpu_failed_for_30_minutes_of_a_10_hour_lease_is_credited_6_25(lease, tenant):
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")
    before = available(tenant)

    credit = sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR)

    # 1800 GPU-s down of 8 × 36 000 = 288 000: availability 1 − 1800/288 000 = 99.375 % < 99.5 %
    # credit: 0.5 GPU-h × $2.50 × 5 = $6.25 (under the $6.67 billed so far)
    m = sla.measure(lease, sla.ensure_sla(lease), lease.starts_at + 10 * HOUR)
    assert (m.down_gpu_seconds, m.lease_gpu_seconds) == (1800, 288_000)
    assert str(m.availability) == "0.993750"
    assert credit.amount_micros == 6_250_000
    assert available(tenant) - before == 6_250_000
    tx = LedgerTransaction.objects.get(cause="sla_credit")
    assert tx.source_id == f"L-{lease.pk}"
    assert "availability 99.3750% < 99.50% (1800 of 288000 GPU-s down" in tx.memo
    assert f"{gpu.node.hostname}/gpu{gpu.index} 1800 s" in tx.memo
    assert Event.objects.get(kind="lease.credited").payload["amount"] == "6.25"
    assert ledger.total_of_all_accounts() == 0


def test_ten_minutes_down_stays_within_99_5_percent_and_credits_nothing(lease, tenant):
    gpu = lease_gpus(lease)[0]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1 * HOUR + timedelta(minutes=10), from_value="failed")
    before = available(tenant)

    # 600 / 288 000 = 0.208 % down: 99.79 % ≥ 99.5 %
    assert sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR) is None
    assert available(tenant) == before
    assert not SlaCredit.objects.exists()
    assert not LedgerTransaction.objects.filter(cause="sla_credit").exists()


def test_the_same_ten_minutes_break_a_reserved_lease_of_99_9_percent(provider, tenant):
    lease = activate(won_lease(tenant, tier="reserved"))
    meter(lease, 10)  # $3.33 billed
    gpu = lease_gpus(lease)[0]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1 * HOUR + timedelta(minutes=10), from_value="failed")

    credit = sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR)

    # 0.208 % down > 0.1 %: 600/3600 GPU-h × $2.50 × 5 = $2.083333
    assert credit.amount_micros == 2_083_333


def test_rerunning_the_credit_pass_never_credits_twice(lease, tenant):
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")
    end = lease.starts_at + 10 * HOUR
    before = available(tenant)

    first = sla.evaluate_lease(lease=lease, now=end)
    again = sla.evaluate_lease(lease=lease, now=end)
    later = sla.evaluate_lease(lease=lease, now=end + timedelta(minutes=5))

    assert first is not None and again is None and later is None
    assert available(tenant) - before == 6_250_000
    assert SlaCredit.objects.count() == 1
    assert Event.objects.filter(kind="lease.credited").count() == 1


def test_more_downtime_later_credits_only_the_increment(lease, tenant):
    first_gpu, second_gpu = lease_gpus(lease)[3], lease_gpus(lease)[5]
    gpu_health(first_gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(first_gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")
    first = sla.evaluate_lease(lease=lease, now=lease.starts_at + 1.5 * HOUR)
    gpu_health(second_gpu, "failed", lease.starts_at + 3 * HOUR)
    gpu_health(second_gpu, "ok", lease.starts_at + 3.5 * HOUR, from_value="failed")
    meter(lease, 40)  # billed: $13.33

    second = sla.evaluate_lease(lease=lease, now=lease.starts_at + 4 * HOUR)

    # owed after 4 h: 3600 GPU-s down → 1 GPU-h × $2.50 × 5 = $12.50, of which $6.25 was paid
    assert (first.amount_micros, second.amount_micros) == (6_250_000, 6_250_000)
    assert second.owed_micros == 12_500_000
    assert second.window_start == first.window_end


def test_a_credit_never_exceeds_what_the_lease_has_cost_so_far(provider, tenant):
    lease = activate(won_lease(tenant))
    meter(lease, 1)  # one minute billed: 8 GPUs × 60 s at $2.50/h = $0.333333
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")

    capped = sla.evaluate_lease(lease=lease, now=lease.starts_at + 2 * HOUR)
    meter(lease, 60)  # the rest of the first hour is billed: $19.99998 in all
    rest = sla.evaluate_lease(lease=lease, now=lease.starts_at + 2 * HOUR + timedelta(minutes=1))

    assert capped.amount_micros == 333_333
    assert "capped at the cost so far" in capped.reason
    assert rest.amount_micros == 6_250_000 - 333_333


def test_an_unreachable_node_counts_its_gpus_down_from_three_missed_heartbeats(lease):
    node = lease_gpus(lease)[0].node
    node_reachability(node, False, lease.starts_at + 1 * HOUR)
    node_reachability(node, True, lease.starts_at + 1 * HOUR + timedelta(minutes=10))
    meter(lease, 60)  # billed: $20.00

    credit = sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR)

    # down from 45 s (3 × 15 s heartbeats) before the event to 10 min after: 645 s × 8 GPUs
    assert credit.down_gpu_seconds == 5160
    assert credit.amount_micros == 17_916_667  # 5160/3600 × $2.50 × 5 = $17.9166666…
    assert "availability 98.2083%" in credit.reason


def test_downtime_counts_only_while_the_gpu_serves_the_active_lease(lease, provider):
    ours = lease_gpus(lease)[0]
    other = next(g for g in gpus_of(provider) if g.node_id != ours.node_id)
    gpu_health(other, "failed", lease.starts_at + 1 * HOUR)  # not in the lease
    gpu_health(ours, "failed", lease.starts_at - 2 * HOUR)  # before the lease
    gpu_health(ours, "ok", lease.starts_at - 1 * HOUR, from_value="failed")

    m = sla.measure(lease, sla.ensure_sla(lease), lease.starts_at + 10 * HOUR)

    assert m.down_gpu_seconds == 0
    assert sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR) is None


def test_a_lease_ended_early_is_measured_until_its_end_and_credited_after_it(lease):
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")
    ended = end(lease, lease.starts_at + 5 * HOUR)
    gpu_health(gpu, "failed", lease.starts_at + 5.5 * HOUR)  # after the end: not ours

    [credit_id] = sla.evaluate_slas(now=lease.starts_at + 5.5 * HOUR)

    # 1800 of 8 × 18 000 = 144 000 GPU-s down: 98.75 %
    credit = SlaCredit.objects.get(pk=credit_id)
    assert (credit.lease_id, credit.down_gpu_seconds, credit.lease_gpu_seconds) == (
        ended.pk, 1800, 144_000)
    assert credit.amount_micros == 6_250_000
    assert sla.evaluate_slas(now=lease.starts_at + 7 * HOUR) == []  # past the hour of grace


def test_a_gpu_still_failed_counts_until_now(lease):
    gpu_health(lease_gpus(lease)[0], "failed", lease.starts_at + 9 * HOUR)

    m = sla.measure(lease, sla.ensure_sla(lease), lease.starts_at + 9.5 * HOUR)

    assert m.down_gpu_seconds == 1800


def test_spot_leases_are_never_credited(provider, tenant):
    lease = activate(won_lease(tenant, tier="spot"), after_s=600)
    meter(lease, 60)
    gpu_health(lease_gpus(lease)[0], "failed", lease.starts_at + 1 * HOUR)

    assert sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR) is None


# --- activation credits ---------------------------------------------------------------------------


def test_a_lease_active_90_s_after_winning_is_credited_one_hour_of_its_price(provider, tenant):
    lease = activate(won_lease(tenant), after_s=90)
    before = available(tenant)

    credit = sla.evaluate_lease(lease=lease, now=lease.starts_at + timedelta(minutes=2))

    assert credit.activation_s == 90
    assert credit.amount_micros == 8 * 2_500_000  # 1 h × 8 GPUs × $2.50
    assert available(tenant) - before == 20_000_000
    assert "active 90 s after winning > 60 s" in credit.reason
    assert sla.evaluate_lease(lease=lease, now=lease.starts_at + HOUR) is None


def test_a_lease_active_within_60_s_is_owed_nothing(provider, tenant):
    lease = activate(won_lease(tenant), after_s=45)

    assert sla.evaluate_lease(lease=lease, now=lease.starts_at + HOUR) is None


# --- the beat -------------------------------------------------------------------------------------


def test_the_beat_stores_terms_and_credits_breaches_once(lease, provider, tenant):
    waiting = won_lease(tenant)  # pending: terms stored, nothing measured
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")

    credited = sla.evaluate_slas(now=lease.starts_at + 10 * HOUR)
    again = sla.evaluate_slas(now=lease.starts_at + 10 * HOUR + timedelta(minutes=1))

    assert credited == [SlaCredit.objects.get(lease=lease).pk] and again == []
    assert LeaseSla.objects.filter(lease=waiting).exists()


# --- the API --------------------------------------------------------------------------------------


def test_the_sla_endpoint_shows_terms_measurement_and_credits(lease, tenant):
    gpu = lease_gpus(lease)[3]
    gpu_health(gpu, "failed", lease.starts_at + 1 * HOUR)
    gpu_health(gpu, "ok", lease.starts_at + 1.5 * HOUR, from_value="failed")
    sla.evaluate_lease(lease=lease, now=lease.starts_at + 10 * HOUR)

    response = client_for(tenant).get(f"/api/v1/leases/{lease.pk}/sla/")

    body = response.json()
    assert response.status_code == 200, body
    assert body["terms"] == {"tier": "on_demand", "availability_target_percent": "99.50",
                             "activation_limit_s": 60, "promised_locality": {}}
    assert body["credited"] == "6.25" and body["cost_so_far"] == "6.66666"
    assert [c["amount"] for c in body["credits"]] == ["6.25"]
    assert body["measurement"]["activation_s"] == 0


def test_a_rival_tenants_lease_sla_is_a_404_and_an_operator_sees_it(lease):
    rival = client_for(make_org("rival-labs", "tenant"))
    operator = client_for(make_org("ibex-ops", "operator"))

    assert rival.get(f"/api/v1/leases/{lease.pk}/sla/").status_code == 404
    assert operator.get(f"/api/v1/leases/{lease.pk}/sla/").status_code == 200

"""The SLA arithmetic on plain numbers (no database)."""

from datetime import UTC, datetime, timedelta

from scheduler.core import sla as core

T0 = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
LEAD = timedelta(seconds=45)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_node_is_down_from_three_missed_heartbeats_before_its_event_until_reachable():
    signals = core.node_signals([(at(60), "node_unreachable"), (at(70), "node_reachable")], LEAD)

    assert core.down_spans(signals, until=at(600)) == [(at(60) - LEAD, at(70))]


def test_the_heartbeat_lead_never_reaches_back_before_the_nodes_previous_event():
    events = [(at(60), "node_unreachable"), (at(70), "node_reachable"),
              (at(70.25), "node_unreachable"), (at(80), "node_reachable")]

    spans = core.down_spans(core.node_signals(events, LEAD), until=at(600))

    assert spans == [(at(60) - LEAD, at(70)), (at(70), at(80))]


def test_a_failed_gpu_stays_down_through_degraded_until_ok():
    signals = core.gpu_signals([(at(10), "failed"), (at(20), "degraded"), (at(30), "ok"),
                                (at(40), "degraded")])

    assert core.down_spans(signals, until=at(600)) == [(at(10), at(30))]


def test_node_and_gpu_downtime_overlapping_count_once():
    signals = (core.node_signals([(at(20), "node_unreachable"), (at(40), "node_reachable")],
                                 timedelta(0))
               + core.gpu_signals([(at(10), "failed"), (at(30), "ok")]))

    spans = core.down_spans(signals, until=at(600))

    assert spans == [(at(10), at(40))]
    assert core.overlap_seconds(spans, (at(15), at(35))) == 20 * 60


def test_availability_exactly_at_the_target_is_no_breach():
    # 0.5 % of 288 000 GPU-s = 1440 GPU-s down: exactly 99.5 %
    assert not core.breaches_availability(1440, 288_000, 9950)
    assert core.breaches_availability(1441, 288_000, 9950)
    assert not core.breaches_availability(10**6, 288_000, None)  # spot: no target


def test_the_worked_example_owes_6_25_and_the_cap_is_the_cost_so_far():
    owed = core.owed(down_gpu_seconds=1800, lease_gpu_seconds=288_000, target_bp=9950,
                     price_micros=2_500_000, multiplier=5, cost_so_far_micros=200_000_000,
                     activation_late=False, gpus=8)
    capped = core.owed(down_gpu_seconds=1800, lease_gpu_seconds=288_000, target_bp=9950,
                       price_micros=2_500_000, multiplier=5, cost_so_far_micros=1_000_000,
                       activation_late=True, gpus=8)

    assert (owed.total_micros, owed.capped) == (6_250_000, False)
    assert (capped.availability_micros, capped.activation_micros, capped.capped) == (
        1_000_000, 20_000_000, True)
    assert str(core.availability(1800, 288_000)) == "0.993750"

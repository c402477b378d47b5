"""The arithmetic of measured bandwidth and link health over plain numbers: words to Gb/s,
counter resets and saturation, hosts shared by leases, errors against the threshold, tiers."""

import pytest

from fabric.core import bandwidth
from fabric.core.bandwidth import HostInterval, LinkReading, Sample

NO_ERRORS = {"symbol_errors": 0, "rcv_errors": 0, "link_downed": 0}


def sample(previous, current, *, at=110.0, previous_at=100.0, extended=True,
           errors=None, previous_errors=None):
    return Sample(at=at, previous_at=previous_at, extended=extended, xmit_data=current,
                  previous_xmit_data=previous, errors=errors or NO_ERRORS,
                  previous_errors=previous_errors or NO_ERRORS)


def test_words_become_gigabits_per_second_at_four_bytes_a_word():
    # 3,125,000,000 words × 32 bits over 10 s = 10 Gb/s
    assert sample(1_000, 1_000 + 3_125_000_000).xmit_gbps() == pytest.approx(10.0)


def test_a_counter_that_went_backwards_gives_no_figure_not_a_negative_one():
    assert bandwidth.data_delta(5_000, 12, extended=True) is None
    assert sample(5_000, 12).xmit_gbps() is None


def test_a_basic_32_bit_counter_stopped_at_its_maximum_gives_no_figure():
    top = 2**32 - 1
    assert bandwidth.data_delta(top - 10, top, extended=False) is None
    assert bandwidth.data_delta(100, 2**32 - 2, extended=False) == 2**32 - 102
    # the extended 64-bit counter goes on past 2^32
    assert bandwidth.data_delta(top - 10, top + 90, extended=True) == 100


def test_a_first_sample_has_no_interval():
    assert bandwidth.data_delta(None, 10, extended=True) is None
    assert sample(None, 10, previous_at=None).xmit_gbps() is None


def test_a_host_interval_sums_its_hca_ports_and_needs_all_of_them():
    two = [sample(0, 3_125_000_000), sample(10, 10 + 3_125_000_000)]
    interval = bandwidth.host_interval(two)
    assert interval == HostInterval(6_250_000_000, 100.0, 110.0)
    assert interval.gbps == pytest.approx(20.0)
    assert bandwidth.host_interval([two[0], sample(5_000, 12)]) is None  # one port reset
    assert bandwidth.host_interval([two[0], sample(0, 10, previous_at=90.0)]) is None  # not read together


def test_the_last_interval_is_the_sum_of_the_hosts_and_unknown_if_one_is():
    a, b = HostInterval(3_125_000_000, 100.0, 110.0), HostInterval(6_250_000_000, 100.0, 110.0)
    assert bandwidth.last_interval_gbps([(a, 50.0), (b, 50.0)]) == pytest.approx(30.0)
    assert bandwidth.last_interval_gbps([(a, 50.0), (None, 50.0)]) is None
    assert bandwidth.last_interval_gbps([]) is None


def test_an_interval_that_started_before_the_lease_came_onto_the_host_is_not_its():
    a = HostInterval(3_125_000_000, 100.0, 110.0)
    assert bandwidth.last_interval_gbps([(a, 105.0)]) is None
    assert bandwidth.last_interval_gbps([(a, 100.0)]) == pytest.approx(10.0)


def test_the_mean_counts_hosts_held_together_and_one_after_another():
    # two hosts at once over [0, 100): 10 + 20 Gb/s
    together = [(3_125_000_000 * 10, 0.0, 100.0), (6_250_000_000 * 10, 0.0, 100.0)]
    assert bandwidth.mean_gbps(together) == pytest.approx(30.0)
    # moved: 10 Gb/s on one host over [0, 100), then 20 Gb/s on another over [100, 200)
    moved = [(3_125_000_000 * 10, 0.0, 100.0), (6_250_000_000 * 10, 100.0, 200.0)]
    assert bandwidth.mean_gbps(moved) == pytest.approx(15.0)
    assert bandwidth.mean_gbps([(0, None, None)]) is None


def test_a_host_shared_by_two_leases_shows_each_the_hosts_whole_traffic():
    host = HostInterval(3_125_000_000, 100.0, 110.0)  # 10 Gb/s on the shared host
    first = bandwidth.last_interval_gbps([(host, 0.0)])
    second = bandwidth.last_interval_gbps([(host, 0.0), (HostInterval(0, 100.0, 110.0), 0.0)])
    assert first == second == pytest.approx(10.0)


def test_errors_per_minute_add_both_ends_over_the_interval():
    ends = [sample(0, 0, errors={"symbol_errors": 5, "rcv_errors": 1, "link_downed": 0}),
            sample(0, 0, errors={"symbol_errors": 0, "rcv_errors": 0, "link_downed": 1})]
    # 7 errors in 10 s = 42 a minute
    assert bandwidth.errors_per_minute(ends) == pytest.approx(42.0)
    assert bandwidth.over_threshold(42.0, 10) is True
    assert bandwidth.over_threshold(42.0, 42) is False  # at the threshold is not above it
    assert bandwidth.over_threshold(None, 10) is None


def test_an_error_counter_reset_or_stuck_at_its_maximum_says_nothing():
    reset = sample(0, 0, errors=NO_ERRORS,
                   previous_errors={"symbol_errors": 9, "rcv_errors": 0, "link_downed": 0})
    assert reset.error_count() is None
    stuck = {"symbol_errors": 65_535, "rcv_errors": 0, "link_downed": 0}
    assert sample(0, 0, errors=stuck, previous_errors=stuck).error_count() is None
    assert bandwidth.errors_per_minute([reset]) is None
    # reaching the maximum in the interval counts what it rose by, at least
    rising = sample(0, 0, errors=stuck,
                    previous_errors={"symbol_errors": 65_000, "rcv_errors": 0, "link_downed": 0})
    assert rising.error_count() == 535


def test_tiers_count_links_down_erring_and_utilisation():
    busy = [sample(0, 3_125_000_000), sample(0, 3_125_000_000)]  # 10 Gb/s each way
    erring = [sample(0, 0, errors={"symbol_errors": 30, "rcv_errors": 0, "link_downed": 0}),
              sample(0, 0)]
    readings = [
        LinkReading("leaf-spine", "active", 100.0, tuple(busy)),
        LinkReading("host-leaf", "active", 100.0, tuple(busy)),
        LinkReading("host-leaf", "down", 100.0, ()),
        LinkReading("host-leaf", "active", 100.0, tuple(erring)),
    ]
    host_leaf, leaf_spine = bandwidth.tiers(readings, threshold_per_minute=10)
    assert (host_leaf.tier, host_leaf.links, host_leaf.down, host_leaf.erring) == \
        ("host-leaf", 3, 1, 1)
    assert host_leaf.errors_per_minute == pytest.approx(180.0)
    # 20 Gb/s of the busy link, 0 of the erring one, over 2 × 2 × 100 Gb/s
    assert host_leaf.utilisation == pytest.approx(0.05)
    assert leaf_spine.utilisation == pytest.approx(0.1)
    assert bandwidth.tier_of_link("spine", "leaf") == "leaf-spine"
    assert bandwidth.tier_of_link("leaf", "host") == "host-leaf"

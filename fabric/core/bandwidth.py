"""Measured bandwidth and link health from port counters, over plain numbers (no Django).

A port's counters come as two samples, the latest and the one before it (`PortCounters`). Data
counters (`PortXmitData`, `PortRcvData`) count 4-byte words: Gb/s over an interval is
``words × 4 × 8 / seconds / 1e9``. A counter that cannot be trusted over an interval gives **no
figure** for it (None), never a negative or made-up one:
- one that went backwards (the port or the agent's host was reset, the counters cleared);
- a basic 32-bit data counter (no `perfquery -x`) that sits at its maximum: it stopped there,
  so how far it would have gone is unknown.
Error counters (`SymbolErrorCounter` 16 bits, `PortRcvErrors` 16, `LinkDownedCounter` 8) also
stop at their maximum: one at its maximum in both samples says nothing of the interval.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

BITS_PER_WORD = 32  # a data counter's unit is a 4-byte word
BASIC_DATA_MAX = 2**32 - 1  # perfquery's basic PortXmitData / PortRcvData saturate here
ERROR_COUNTER_MAX = {"symbol_errors": 2**16 - 1, "rcv_errors": 2**16 - 1,
                     "link_downed": 2**8 - 1}
ERROR_COUNTERS = tuple(ERROR_COUNTER_MAX)  # the counters a link's error rate is made of


def data_delta(previous: int | None, current: int, *, extended: bool) -> int | None:
    """Words counted between two samples; None when unknown (no previous sample, a reset, a
    basic counter stopped at its maximum)."""
    if previous is None or current < previous:
        return None
    if not extended and current >= BASIC_DATA_MAX:
        return None
    return current - previous


def gbps(words: int, seconds: float) -> float | None:
    """Gb/s of `words` 4-byte words over `seconds`; None over no time."""
    if seconds <= 0:
        return None
    return words * BITS_PER_WORD / seconds / 1e9


def error_delta(name: str, previous: int | None, current: int) -> int | None:
    """Errors counted between two samples of one error counter; None when unknown (no previous
    sample, a reset, or a counter at its maximum in both samples). A counter that reached its
    maximum in the interval counts at least what it rose by."""
    if previous is None or current < previous:
        return None
    if previous >= ERROR_COUNTER_MAX[name]:
        return None
    return current - previous


@dataclass(frozen=True)
class Sample:
    """One port's two samples: the latest and the previous (seconds are any monotonic epoch)."""

    at: float
    previous_at: float | None
    extended: bool
    xmit_data: int
    previous_xmit_data: int | None
    errors: dict[str, int]
    previous_errors: dict[str, int | None]

    @property
    def seconds(self) -> float | None:
        return None if self.previous_at is None else self.at - self.previous_at

    def xmit_words(self) -> int | None:
        return data_delta(self.previous_xmit_data, self.xmit_data, extended=self.extended)

    def xmit_gbps(self) -> float | None:
        words, seconds = self.xmit_words(), self.seconds
        return None if words is None or seconds is None else gbps(words, seconds)

    def error_count(self) -> int | None:
        """Errors of the error counters over the interval; None if any of them is unknown."""
        total = 0
        for name in ERROR_COUNTERS:
            delta = error_delta(name, self.previous_errors.get(name), self.errors[name])
            if delta is None:
                return None
            total += delta
        return total


def errors_per_minute(samples: Iterable[Sample]) -> float | None:
    """A link's error rate from its ends' samples: the errors of both ends over the longest of
    their intervals, per minute. None when no end gives a figure; an end without one is left
    out (the other end's errors still count)."""
    total, seconds, known = 0, 0.0, False
    for sample in samples:
        count, span = sample.error_count(), sample.seconds
        if count is None or not span or span <= 0:
            continue
        total, seconds, known = total + count, max(seconds, span), True
    if not known:
        return None
    return total * 60.0 / seconds


def over_threshold(rate_per_minute: float | None, threshold_per_minute: int) -> bool | None:
    """Whether a link errs above the provider's threshold (None: no figure this interval, so
    the link keeps what it was)."""
    if rate_per_minute is None:
        return None
    return rate_per_minute > threshold_per_minute


@dataclass(frozen=True)
class HostInterval:
    """A host's traffic over one interval: the words its HCA ports sent and the seconds."""

    words: int
    started_at: float
    ended_at: float

    @property
    def gbps(self) -> float | None:
        return gbps(self.words, self.ended_at - self.started_at)


def host_interval(samples: Iterable[Sample]) -> HostInterval | None:
    """The interval of a host's HCA ports, read in the same poll: their words summed. None when
    a port gives no figure (a reset, a saturated counter) or the ports were not read together:
    a host's figure is all of its ports or nothing."""
    samples = list(samples)
    if not samples:
        return None
    words = 0
    for sample in samples:
        delta = sample.xmit_words()
        if delta is None or sample.previous_at is None:
            return None
        words += delta
    if len({(s.at, s.previous_at) for s in samples}) != 1:
        return None
    return HostInterval(words, samples[0].previous_at, samples[0].at)


@dataclass(frozen=True)
class Delivered:
    """A lease's delivered bandwidth: the last interval (Gb/s, None when unknown), its mean
    since it started (None before a whole interval was measured), and whether a host it is on
    serves another lease too (then each lease is shown the host's whole traffic)."""

    last_interval_gbps: float | None
    mean_gbps: float | None
    sampled_at: float | None
    shared: bool


def last_interval_gbps(hosts: Iterable[tuple[HostInterval | None, float | None]]
                       ) -> float | None:
    """Σ of the hosts' Gb/s over their last interval, from (interval, since) pairs, `since`
    being when the lease came onto the host. None when a host gives no figure or its interval
    started before `since` (it would count traffic that was not the lease's)."""
    total, any_host = 0.0, False
    for interval, since in hosts:
        if interval is None or (since is not None and interval.started_at < since):
            return None
        rate = interval.gbps
        if rate is None:
            return None
        total, any_host = total + rate, True
    return total if any_host else None


def mean_gbps(accounts: Iterable[tuple[int, float | None, float | None]]) -> float | None:
    """A lease's mean since it started, from its accounts (one per host it was or is on: words
    counted, first and last sampled moment): all the words over the time from the first
    counted interval's start to the last one's end. Hosts held at the same time add their
    traffic; a lease that moved counts each host for the time it was there."""
    words, first, last = 0, None, None
    for counted, start, end in accounts:
        if start is None or end is None:
            continue
        words += counted
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
    if first is None or last is None or last <= first:
        return None
    return gbps(words, last - first)


# --- the fabric per tier -------------------------------------------------------------------------

TIER_ORDER = ("host", "leaf", "spine", "core", "router")


def tier_of_link(a_tier: str, b_tier: str) -> str:
    """`host-leaf`, `leaf-spine`, `spine-core`, ... (the lower tier first)."""
    order = {tier: i for i, tier in enumerate(TIER_ORDER)}
    low, high = sorted((a_tier, b_tier), key=lambda t: (order.get(t, len(order)), t))
    return f"{low}-{high}"


@dataclass(frozen=True)
class LinkReading:
    """One link as the provider's picture needs it: its tier, state, rate and its ends'
    samples."""

    tier: str
    state: str
    rate_gbps: float | None
    ends: tuple[Sample, ...]
    errors_per_minute: float | None = None


@dataclass
class TierHealth:
    tier: str
    links: int = 0
    down: int = 0
    erring: int = 0
    errors_per_minute: float = 0.0
    traffic_gbps: float = 0.0
    capacity_gbps: float = 0.0
    measured: int = 0

    @property
    def utilisation(self) -> float | None:
        """Traffic over the capacity of the links measured (both directions), 0 to 1."""
        if self.capacity_gbps <= 0:
            return None
        return min(self.traffic_gbps / self.capacity_gbps, 1.0)


def tiers(readings: Iterable[LinkReading], threshold_per_minute: int) -> list[TierHealth]:
    """Per tier: links, those down, those erring above the threshold, the errors per minute,
    and the traffic over capacity of the active links whose both ends gave a figure (each
    direction is one end's xmit)."""
    found: dict[str, TierHealth] = {}
    for link in readings:
        health = found.setdefault(link.tier, TierHealth(link.tier))
        health.links += 1
        if link.state == "down":
            health.down += 1
            continue
        rate = link.errors_per_minute
        if rate is None:
            rate = errors_per_minute(link.ends)
        if rate is not None:
            health.errors_per_minute += rate
            if rate > threshold_per_minute:
                health.erring += 1
        rates = [end.xmit_gbps() for end in link.ends]
        if link.state == "active" and link.rate_gbps and len(rates) == 2 \
                and all(r is not None for r in rates):
            health.traffic_gbps += sum(rates)
            health.capacity_gbps += 2 * link.rate_gbps
            health.measured += 1
    return sorted(found.values(), key=lambda t: _tier_rank(t.tier))


def _tier_rank(tier: str) -> tuple:
    rank = {name: i for i, name in enumerate(TIER_ORDER)}
    return tuple(rank.get(part, len(rank)) for part in tier.split("-")) + (tier,)

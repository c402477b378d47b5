"""SLA arithmetic over plain data (no Django): when a GPU was down, how available a lease was,
and what it is owed. `scheduler/sla.py` feeds it rows; tests feed it numbers.

A GPU is down while its node is unreachable or the GPU itself has failed:
- a node's `node_unreachable` event is written three missed heartbeats after the last one, so
  the node is counted down from the event time less `lead` (3 heartbeat intervals), never
  earlier than its previous event, until its `node_reachable` event;
- a GPU's `gpu_health` event to `failed` counts it down until an event back to `ok`
  (`degraded` is slower, not down).
Downtime counts only while the GPU is allocated to the lease and the lease is active.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from billing.core.money import divide_rounded

Span = tuple[datetime, datetime]


@dataclass(frozen=True)
class Signal:
    """One health event as the SLA sees it: from `at`, `source` ("node", "gpu" or "link": a
    guaranteed lease's bandwidth broken on its routes) is down or not."""

    at: datetime
    source: str
    down: bool


def node_signals(events: Iterable[tuple[datetime, str]], lead: timedelta) -> list[Signal]:
    """(at, kind) node events, oldest first → signals; unreachable counts from `at - lead`."""
    signals, previous = [], None
    for at, kind in events:
        if kind == "node_unreachable":
            start = at - lead if previous is None else max(at - lead, previous)
            signals.append(Signal(start, "node", True))
        elif kind == "node_reachable":
            signals.append(Signal(at, "node", False))
        previous = at
    return signals


def link_signals(events: Iterable[tuple[datetime, str]]) -> list[Signal]:
    """(at, kind) lease events → signals: every GPU of a guaranteed lease is down from
    `bandwidth_broken` (no placement keeps its guarantee: a link fault) to
    `bandwidth_restored`."""
    signals = []
    for at, kind in events:
        if kind == "bandwidth_broken":
            signals.append(Signal(at, "link", True))
        elif kind == "bandwidth_restored":
            signals.append(Signal(at, "link", False))
    return signals


def gpu_signals(events: Iterable[tuple[datetime, str]]) -> list[Signal]:
    """(at, to_value) GPU health events → signals: down at `failed`, up again at `ok`."""
    signals = []
    for at, to_value in events:
        if to_value == "failed":
            signals.append(Signal(at, "gpu", True))
        elif to_value == "ok":
            signals.append(Signal(at, "gpu", False))
    return signals


def down_spans(signals: Iterable[Signal], until: datetime) -> list[Span]:
    """Spans during which any source was down, up to `until`."""
    down = {"node": False, "gpu": False, "link": False}
    spans, start = [], None
    for signal in sorted(signals, key=lambda s: (s.at, s.down)):
        was_down = any(down.values())
        down[signal.source] = signal.down
        if not was_down and any(down.values()):
            start = signal.at
        elif was_down and not any(down.values()):
            spans.append((start, signal.at))
    if any(down.values()) and start < until:
        spans.append((start, until))
    return spans


def overlap_seconds(spans: Sequence[Span], window: Span) -> int:
    """Whole seconds of `spans` inside `window` (spans do not overlap one another)."""
    lower, upper = window
    total = 0.0
    for start, end in spans:
        start, end = max(start, lower), min(end, upper)
        if end > start:
            total += (end - start).total_seconds()
    return int(total)


def availability(down_gpu_seconds: int, lease_gpu_seconds: int) -> Decimal:
    """1 − down / total, to six places (1 when nothing has run yet)."""
    if lease_gpu_seconds <= 0:
        return Decimal("1.000000")
    value = 1 - Decimal(down_gpu_seconds) / Decimal(lease_gpu_seconds)
    return value.quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)


def breaches_availability(down_gpu_seconds: int, lease_gpu_seconds: int,
                          target_bp: int | None) -> bool:
    """availability < target, in integers: down / total > (10000 − target) / 10000."""
    if target_bp is None or lease_gpu_seconds <= 0:
        return False
    return down_gpu_seconds * 10_000 > (10_000 - target_bp) * lease_gpu_seconds


def downtime_credit_micros(down_gpu_seconds: int, price_micros: int, multiplier: int) -> int:
    """Down GPU-hours × price per GPU-hour × multiplier, rounded half to even."""
    return divide_rounded(down_gpu_seconds * price_micros * multiplier, 3600)


def activation_credit_micros(price_micros: int, gpus: int) -> int:
    """A late start is owed one hour of the lease: price × GPUs."""
    return price_micros * gpus


@dataclass(frozen=True)
class Owed:
    availability_micros: int  # after the cap
    activation_micros: int
    capped: bool

    @property
    def total_micros(self) -> int:
        return self.availability_micros + self.activation_micros


def owed(*, down_gpu_seconds: int, lease_gpu_seconds: int, target_bp: int | None,
         price_micros: int, multiplier: int, cost_so_far_micros: int,
         activation_late: bool, gpus: int) -> Owed:
    """What the lease is owed in all so far: downtime credit when availability broke its target,
    capped at what the lease has cost so far; plus one hour for a late activation."""
    availability_micros, capped = 0, False
    if breaches_availability(down_gpu_seconds, lease_gpu_seconds, target_bp):
        availability_micros = downtime_credit_micros(down_gpu_seconds, price_micros, multiplier)
        if availability_micros > cost_so_far_micros:
            availability_micros, capped = max(cost_so_far_micros, 0), True
    activation_micros = activation_credit_micros(price_micros, gpus) if activation_late else 0
    return Owed(availability_micros, activation_micros, capped)

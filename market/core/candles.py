"""Market data over plain data: the time range of a candles request, its intervals (empty ones
included), and the order of an order book's rows. The queries are `market.market_data`'s.

Intervals are in UTC: an hour starts on the hour, a day at 00:00 UTC. A range is `from`
(inclusive, moved back to the start of its interval) to `to` (exclusive, moved on to the end
of its interval).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from fabric.core.locality import CONSTRAINT_LEVELS

INTERVALS = {"1h": timedelta(hours=1), "1d": timedelta(days=1)}
DEFAULT_INTERVAL = "1h"
# without `from`: the last day of hours, the last 30 days
DEFAULT_COUNT = {"1h": 24, "1d": 30}
MAX_CANDLES = 1000
FORMATS = ("json", "csv")
# a book's rows within one price: no topology required first, then node, leaf, spine
TOPOLOGY_ORDER = ("none", *CONSTRAINT_LEVELS)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class MarketDataError(ValueError):
    """A bad parameter of a market-data request; `param` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


@dataclass(frozen=True)
class CandleRange:
    interval: str
    start: datetime  # the first interval's start
    end: datetime  # the last interval's end (exclusive)

    @property
    def step(self) -> timedelta:
        return INTERVALS[self.interval]

    @property
    def count(self) -> int:
        return (self.end - self.start) // self.step

    def starts(self) -> list[datetime]:
        return [self.start + i * self.step for i in range(self.count)]


@dataclass(frozen=True)
class Candle:
    """One interval's clearings: prices in micro-dollars per GPU-hour (None: no clearing of
    the interval had a price), what they sold."""

    start: datetime
    end: datetime
    open: int | None = None
    high: int | None = None
    low: int | None = None
    close: int | None = None
    clearings: int = 0
    gpus_sold: int = 0
    gpu_hours_sold: int = 0


def check_format(text: str | None) -> str:
    value = (text or "json").strip().lower()
    if value not in FORMATS:
        raise MarketDataError("format", f"Use one of {', '.join(FORMATS)}.")
    return value


def parse_instant(param: str, text: str) -> datetime:
    """An ISO 8601 date or date and time, in UTC (without a zone it is UTC). A `+` a query string
    turned into a space (`...T00:00:00 00:00`) is read as the `+` it was."""
    value = text.strip()
    if "T" in value and " " in value:
        value = value.replace(" ", "+")
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise MarketDataError(param, f"Not a date or time: {text!r}; use ISO 8601, e.g. "
                                     "2026-12-01 or 2026-12-01T06:00:00Z.") from None
    try:
        return instant.astimezone(UTC) if instant.tzinfo else instant.replace(tzinfo=UTC)
    except OverflowError:  # an offset that takes it past year 1 or 9999
        raise MarketDataError(param, "Out of the range of dates.") from None


def floor(instant: datetime, step: timedelta) -> datetime:
    """The start of the interval `instant` falls in (UTC hours or days)."""
    return instant - (instant - EPOCH) % step


def ceil(instant: datetime, step: timedelta) -> datetime:
    start = floor(instant, step)
    return start if start == instant else start + step


def candle_range(*, interval: str | None, start: str | None, end: str | None,
                 now: datetime) -> CandleRange:
    """The intervals a request asks for. Without `to`, up to the end of the interval running
    now; without `from`, the default count of intervals before `to`."""
    name = (interval or DEFAULT_INTERVAL).strip()
    if name not in INTERVALS:
        raise MarketDataError("interval", f"Use one of {', '.join(INTERVALS)}.")
    step = INTERVALS[name]
    first = parse_instant("from", start) if start else None
    last = parse_instant("to", end) if end else None
    if first is not None and last is not None and first >= last:
        raise MarketDataError("from", "from must be before to.")
    try:
        last_end = ceil(last, step) if last is not None else floor(now, step) + step
        first_start = (last_end - DEFAULT_COUNT[name] * step if first is None
                       else floor(first, step))
    except OverflowError:  # within a day of year 1 or year 9999
        raise MarketDataError("to" if last is not None else "from",
                              "Out of the range of dates.") from None
    if first is not None:
        if first_start >= last_end:
            raise MarketDataError("from", "from must be before to (now, when to is not given).")
    rng = CandleRange(name, first_start, last_end)
    if rng.count > MAX_CANDLES:
        raise MarketDataError("from", f"At most {MAX_CANDLES} intervals of {name} at once; "
                                      f"from and to span {rng.count}.")
    return rng


def fill_candles(rng: CandleRange, found: Mapping[datetime, Candle]) -> list[Candle]:
    """Every interval of the range in time order: the candles found, the others empty."""
    step = rng.step
    return [replace(found[start], start=start, end=start + step) if start in found
            else Candle(start=start, end=start + step) for start in rng.starts()]


def topology_rank(level: str) -> int:
    return TOPOLOGY_ORDER.index(level) if level in TOPOLOGY_ORDER else len(TOPOLOGY_ORDER)


def sorted_book(rows: Iterable[dict]) -> list[dict]:
    """Book rows (`price_micros`, `topology`, ...): the highest price first, and within one
    price the topology levels from none to the widest."""
    return sorted(rows, key=lambda row: (-row["price_micros"], topology_rank(row["topology"]),
                                         row["topology"]))


def merged_book(rows: Iterable[dict]) -> list[dict]:
    """Rows of one price and topology level summed into one (`bids`, `gpus`, `gpu_hours`)."""
    merged: dict[tuple, dict] = {}
    for row in rows:
        key = (row["price_micros"], row["topology"])
        if key in merged:
            for name in ("bids", "gpus", "gpu_hours"):
                merged[key][name] += row[name]
        else:
            merged[key] = dict(row)
    return list(merged.values())

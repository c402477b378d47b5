"""Small server-drawn SVG charts (no JavaScript): a percentage line over time, a market's
candles and its book's depth. The geometry is `web.core.chart_geometry`'s; here the labels."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from market.core.candles import Candle
from web.core.chart_geometry import (
    BarShape,
    CandleShape,
    Frame,
    bars,
    candle_shapes,
    linear,
    padded,
    slots,
    ticks,
)
from web.templatetags.web_tags import dollars


@dataclass(frozen=True)
class LineChart:
    width: int
    height: int
    points: str  # the polyline's "x,y x,y ..."
    dots: list[tuple[float, float, str]]  # x, y, tooltip
    y_ticks: list[tuple[float, str]]  # y, label
    x_labels: list[tuple[float, str]]


def percent_line(samples: list[tuple[datetime, float]], *, width: int = 1100, height: int = 240,
                 pad: int = 44, label: str = "") -> LineChart | None:
    """(time, percent 0–100) samples, oldest first → a line on a fixed 0–100 % axis."""
    if len(samples) < 2:
        return None
    times = [t.timestamp() for t, _ in samples]
    t0, t1 = times[0], times[-1]

    def x(t):
        return pad + 30 + (width - 2 * pad - 30) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)

    def y(v):
        return 12 + (height - pad - 12) * (100 - v) / 100

    coords = [(round(x(t), 1), round(y(v), 1)) for t, v in zip(times, (v for _, v in samples),
                                                                strict=True)]
    dots = [(cx, cy, f"{stamp:%Y-%m-%d %H:%M} — {v:.1f} %{label}")
            for (cx, cy), (stamp, v) in zip(coords, samples, strict=True)]
    ticks = [(round(y(v), 1), f"{v} %") for v in (0, 25, 50, 75, 100)]
    middle = len(samples) // 2
    x_labels = [(coords[i][0], f"{samples[i][0]:%b %d %H:%M}") for i in (0, middle, -1)]
    return LineChart(width, height, " ".join(f"{a},{b}" for a, b in coords), dots, ticks,
                     x_labels)


# --- the market page: candles of clearing prices, the depth of the next clearing's book ---------

# sized to sit beside a table: text of 12 units reads at about 12 px
CANDLE_FRAME = Frame(width=640, height=300, left=60, right=8, top=12, bottom=100)
VOLUME_BAND = (226, 272)  # the GPU-hours sold, under the prices
DEPTH_FRAME = Frame(width=640, height=240, left=60, right=8, top=12, bottom=28)
MAX_X_LABELS = 7


@dataclass(frozen=True)
class CandleMark:
    shape: CandleShape
    tip: str


@dataclass(frozen=True)
class CandleChart:
    width: int
    height: int
    candles: list[CandleMark]
    volume: list[tuple[BarShape, str]]
    y_ticks: list[tuple[float, str]]
    x_labels: list[tuple[float, str]]
    plot_left: int
    plot_bottom: float
    volume_top: int
    volume_bottom: int
    volume_label: str


@dataclass(frozen=True)
class DepthChart:
    width: int
    height: int
    bars: list[tuple[BarShape, str]]
    y_ticks: list[tuple[float, str]]
    x_labels: list[tuple[float, str]]
    plot_left: int
    plot_bottom: float


def _every(n: int) -> int:
    return max(1, -(-n // MAX_X_LABELS))


def candle_chart(candles: list[Candle], interval: str) -> CandleChart | None:
    """Candles (open, high, low, close of clearing prices) over bars of GPU-hours sold; None
    when no interval had a price."""
    frame = CANDLE_FRAME
    priced = [c for c in candles if c.high is not None]
    if not priced:
        return None
    low, high = padded([c.low for c in priced] + [c.high for c in priced], least_span=100_000)
    y = linear(low, high, frame.plot_bottom, frame.top)
    stamp = "%H:%M" if interval == "1h" else "%b %d"
    shapes = candle_shapes([None if c.high is None else (c.open, c.high, c.low, c.close)
                            for c in candles], frame, y)
    marks = [CandleMark(shape, f"{candles[i].start:%Y-%m-%d %H:%M} UTC — open "
                               f"{dollars(candles[i].open)}, high {dollars(candles[i].high)}, "
                               f"low {dollars(candles[i].low)}, close {dollars(candles[i].close)}")
             for i, shape in shapes]
    top, bottom = VOLUME_BAND
    volume = [(bar, f"{c.start:%Y-%m-%d %H:%M} UTC — {c.gpus_sold} GPUs, "
                    f"{c.gpu_hours_sold} GPU-hours sold in {c.clearings} clearings")
              for bar, c in zip(bars([c.gpu_hours_sold for c in candles], frame, top=top,
                                     bottom=bottom), candles, strict=True)]
    centres, _ = slots(len(candles), frame)
    step = _every(len(candles))
    return CandleChart(
        width=frame.width, height=frame.height, candles=marks, volume=volume,
        y_ticks=[(y(v), dollars(v)) for v in ticks(low, high, step=10_000)],
        x_labels=[(centres[i], f"{candles[i].start:{stamp}}")
                  for i in range(0, len(candles), step)],
        plot_left=frame.left - 18, plot_bottom=frame.plot_bottom, volume_top=top,
        volume_bottom=bottom,
        volume_label=f"GPU-hours sold (most {max(c.gpu_hours_sold for c in candles)})")


def depth_levels(levels: list[dict]) -> list[dict]:
    """A book's rows (highest price first) summed per price, with the GPUs bid at that price
    or more: `price_micros`, `bids`, `gpus`, `gpu_hours`, `cumulative_gpus` and `topologies`
    (the rows' required levels and GPUs, in the book's order)."""
    per_price: dict[int, dict] = {}
    for row in levels:
        level = per_price.setdefault(row["price_micros"], {
            "price_micros": row["price_micros"], "bids": 0, "gpus": 0, "gpu_hours": 0,
            "topologies": []})
        level["bids"] += row["bids"]
        level["gpus"] += row["gpus"]
        level["gpu_hours"] += row["gpu_hours"]
        level["topologies"].append((row["topology"], row["gpus"]))
    total = 0
    for level in per_price.values():  # in the book's order: the highest price first
        total += level["gpus"]
        level["cumulative_gpus"] = total
    return list(per_price.values())


def depth_chart(levels: list[dict]) -> DepthChart | None:
    """Bars of the GPUs bid at each price or more, the highest price at the left; None for
    an empty book."""
    if not levels:
        return None
    frame = DEPTH_FRAME
    most = levels[-1]["cumulative_gpus"]
    shapes = bars([level["cumulative_gpus"] for level in levels], frame, top=frame.top,
                  bottom=frame.plot_bottom)
    y = linear(0, most or 1, frame.plot_bottom, frame.top)
    centres, _ = slots(len(levels), frame)
    step = _every(len(levels))
    return DepthChart(
        width=frame.width, height=frame.height,
        bars=[(bar, f"{level['cumulative_gpus']} GPUs bid at {dollars(level['price_micros'])} "
                    f"or more ({level['gpus']} at {dollars(level['price_micros'])})")
              for bar, level in zip(shapes, levels, strict=True)],
        y_ticks=[(y(v), f"{v}") for v in ticks(0, most, step=1)],
        x_labels=[(centres[i], dollars(levels[i]["price_micros"]))
                  for i in range(0, len(levels), step)],
        plot_left=frame.left - 18, plot_bottom=frame.plot_bottom)

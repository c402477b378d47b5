"""Small server-drawn SVG charts (no JavaScript): a price line over time."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from web.templatetags.web_tags import dollars


@dataclass(frozen=True)
class LineChart:
    width: int
    height: int
    points: str  # the polyline's "x,y x,y ..."
    dots: list[tuple[float, float, str]]  # x, y, tooltip
    y_ticks: list[tuple[float, str]]  # y, label
    x_labels: list[tuple[float, str]]


def price_line(samples: list[tuple[datetime, int]], *, width: int = 1100, height: int = 260,
               pad: int = 44) -> LineChart | None:
    """(time, micro-dollars) samples, oldest first → a line chart; None under two samples."""
    if len(samples) < 2:
        return None
    times = [t.timestamp() for t, _ in samples]
    values = [v for _, v in samples]
    t0, t1 = min(times), max(times)
    low, high = min(values), max(values)
    if high == low:
        low, high = low - 500_000, high + 500_000
    low = max(0, low - (high - low) // 10)
    high = high + (high - low) // 10

    def x(t):
        return pad + 30 + (width - 2 * pad - 30) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)

    def y(v):
        return 12 + (height - pad - 12) * (high - v) / (high - low)

    coords = [(round(x(t), 1), round(y(v), 1)) for t, v in zip(times, values, strict=True)]
    dots = [(cx, cy, f"{stamp:%Y-%m-%d %H:%M} — {dollars(v)}")
            for (cx, cy), (stamp, v) in zip(coords, samples, strict=True)]
    # ticks at whole cents
    tick_values = [round((low + (high - low) * i / 4) / 10_000) * 10_000 for i in range(5)]
    ticks = [(round(y(v), 1), dollars(v)) for v in tick_values]
    x_labels = [(coords[0][0], f"{samples[0][0]:%b %d %H:%M}"),
                (coords[-1][0], f"{samples[-1][0]:%b %d %H:%M}")]
    return LineChart(width, height, " ".join(f"{a},{b}" for a, b in coords), dots, ticks,
                     x_labels)


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

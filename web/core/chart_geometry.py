"""The geometry of the market page's SVG charts, over plain numbers: values scaled to SVG
coordinates (y grows downwards), candles and depth bars as rectangles and lines. Labels and
markup are `web.charts`' and the templates'."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Frame:
    """A chart's plotting area inside its viewBox."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int

    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_bottom(self) -> float:
        return self.height - self.bottom


def linear(lo: float, hi: float, start: float, stop: float) -> Callable[[float], float]:
    """Maps [lo, hi] onto [start, stop] (stop may be below start); a single value to the
    middle."""
    def scale(value: float) -> float:
        if hi == lo:
            return round((start + stop) / 2, 1)
        return round(start + (stop - start) * (value - lo) / (hi - lo), 1)
    return scale


def padded(values: Sequence[int], *, least_span: int, floor: int | None = 0) -> tuple[int, int]:
    """Bounds around the values with a tenth of their span spare on each side (at least
    `least_span` wide), never below `floor`."""
    low, high = min(values), max(values)
    if high - low < least_span:
        middle = (low + high) // 2
        low, high = middle - least_span // 2, middle + least_span // 2
    spare = (high - low) // 10
    low, high = low - spare, high + spare
    if floor is not None and low < floor:
        low = floor
    return low, high


def ticks(low: int, high: int, *, count: int = 4, step: int = 1) -> list[int]:
    """`count + 1` evenly spaced values from low to high, rounded to multiples of `step`."""
    return sorted({round((low + (high - low) * i / count) / step) * step
                   for i in range(count + 1)})


def slots(n: int, frame: Frame) -> tuple[list[float], float]:
    """The centres of `n` equal slots across the plot, and a slot's width."""
    width = frame.plot_width / max(n, 1)
    return [round(frame.left + width * (i + 0.5), 1) for i in range(n)], width


@dataclass(frozen=True)
class CandleShape:
    x: float  # the slot's centre: the wick
    body_x: float
    body_width: float
    wick_top: float
    wick_bottom: float
    body_top: float
    body_height: float
    rising: bool  # closed at or above its open


@dataclass(frozen=True)
class BarShape:
    x: float
    y: float
    width: float
    height: float


def candle_shapes(ohlc: Sequence[tuple[int, int, int, int] | None], frame: Frame,
                  y: Callable[[float], float]) -> list[tuple[int, CandleShape]]:
    """(slot index, shape) for each interval with prices (open, high, low, close)."""
    centres, width = slots(len(ohlc), frame)
    body = max(1.0, round(width * 0.6, 1))
    shapes = []
    for i, prices in enumerate(ohlc):
        if prices is None:
            continue
        first, high, low, last = prices
        top, bottom = y(max(first, last)), y(min(first, last))
        shapes.append((i, CandleShape(
            x=centres[i], body_x=round(centres[i] - body / 2, 1), body_width=body,
            wick_top=y(high), wick_bottom=y(low), body_top=top,
            body_height=max(1.0, round(bottom - top, 1)), rising=last >= first)))
    return shapes


def bars(values: Sequence[int], frame: Frame, *, top: float, bottom: float,
         high: int | None = None) -> list[BarShape]:
    """One bar per slot from `bottom` up, scaled so `high` (default: the largest) reaches
    `top`; a zero is a bar of no height."""
    centres, width = slots(len(values), frame)
    ceiling = high if high is not None else max(values, default=0)
    scale = linear(0, ceiling or 1, bottom, top)
    thickness = max(1.0, round(width * 0.7, 1))
    return [BarShape(x=round(centre - thickness / 2, 1), y=scale(value), width=thickness,
                     height=round(bottom - scale(value), 1))
            for centre, value in zip(centres, values, strict=True)]

"""Output for people: aligned tables sized to the terminal, money with its currency, times
relative to now, a spinner, colour only on a terminal (and never with NO_COLOR)."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from datetime import UTC, datetime
from decimal import Decimal

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
COLOURS = {"green": 32, "red": 31, "yellow": 33, "dim": 2, "bold": 1}
STATE_COLOURS = {"active": "green", "filled": "green", "exited": "green", "running": "green",
                 "failed": "red", "refused": "red", "preempted": "red", "terminated": "dim",
                 "completed": "dim", "cancelled": "dim", "expired": "dim",
                 "pending": "yellow", "placing": "yellow", "resting": "yellow",
                 "open": "yellow", "queued": "yellow", "preempting": "yellow"}


def use_colour(stream) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")


def paint(text: str, colour: str | None, stream=None) -> str:
    if not colour or not use_colour(stream or sys.stdout):
        return text
    return f"\033[{COLOURS[colour]}m{text}\033[0m"


def state(text: str, stream=None) -> str:
    return paint(text, STATE_COLOURS.get(text), stream)


def money(amount: Decimal | None, currency: str = "usd", per: str = "") -> str:
    """`2.49 USD`, `2.49 USD/GPU-h`; at least cents, never rounded away."""
    if amount is None:
        return "-"
    if amount == amount.quantize(Decimal("0.01")):
        amount = amount.quantize(Decimal("0.01"))
    return f"{amount:,} {currency.upper()}{'/' + per if per else ''}"


def relative(moment: datetime | None, now: datetime | None = None) -> str:
    """`in 3 h`, `12 min ago`, `now`."""
    if moment is None:
        return "-"
    now = now or datetime.now(UTC)
    seconds = (moment - now).total_seconds()
    size = abs(seconds)
    if size < 45:
        return "now"
    for unit, length in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if size >= length * (1 if unit == "min" else 1.5 if unit == "h" else 2):
            count = round(size / length)
            break
    else:
        unit, count = "min", 1
    return f"in {count} {unit}" if seconds > 0 else f"{count} {unit} ago"


def width(stream=None) -> int | None:
    """The terminal's width; None (no limit) where the output is not a terminal."""
    stream = stream or sys.stdout
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return shutil.get_terminal_size((100, 24)).columns


def table(rows: list[list], headers: list[str] | None, *, stream=None,
          max_width: int | None = None, right: set[int] = frozenset()) -> str:
    """Columns aligned; when too wide for the terminal, the widest column is cut with `…`.
    Without headers, no header line."""
    shown = headers is not None
    headers = headers if shown else [""] * len(rows[0])
    cells = [[str(c) for c in headers]] + [["" if c is None else str(c) for c in row]
                                            for row in rows]
    widths = [max(len(_plain(r[i])) for r in cells) for i in range(len(headers))]
    limit = max_width or width(stream)
    room = (limit or sum(widths)) - 2 * (len(headers) - 1)
    while limit and sum(widths) > room:
        widest = max(range(len(widths)), key=widths.__getitem__)
        if widths[widest] <= 8:
            break
        widths[widest] -= 1
    lines = []
    for n, row in enumerate(cells):
        out = []
        for i, cell in enumerate(row):
            text = _cut(cell, widths[i])
            pad = " " * (widths[i] - len(_plain(text)))
            out.append(pad + text if i in right else text + pad)
        line = "  ".join(out).rstrip()
        if n or shown:
            lines.append(paint(line, "bold", stream) if n == 0 else line)
    return "\n".join(lines)


def _plain(text: str) -> str:
    while "\033[" in text:
        start = text.index("\033[")
        end = text.index("m", start)
        text = text[:start] + text[end + 1:]
    return text


def _cut(text: str, size: int) -> str:
    if len(_plain(text)) <= size:
        return text
    return _plain(text)[: max(size - 1, 0)] + "…"


class Spinner:
    """A spinner on stderr while something is awaited; silent where stderr is no terminal."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.frames = itertools.cycle(FRAMES)
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.shown = False

    def tick(self, text: str) -> None:
        if self.live:
            self.stream.write(f"\r\033[K{next(self.frames)} {text}")
            self.stream.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self.shown = False

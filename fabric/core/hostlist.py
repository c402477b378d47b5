"""Slurm hostlist expressions: ``node[01-04,07]`` <-> ``[node01, node02, node03, node04, node07]``.

Semantics follow Slurm: the zero padding of a range is the width of its lower bound, several
bracket groups in one name multiply out (``rack[1-2]-node[01-02]``), and compression only folds
the trailing number of each name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from fabric.core.errors import HostlistError

# A guard against expressions such as node[1-999999999] that would exhaust memory.
# The largest fabrics described are about 12,500 hosts (100,000 GPUs): a hostlist naming more
# than 200,000 is a mistake or an attack (a few bytes would otherwise ask for millions).
MAX_EXPANSION = 200_000

_BOUND = re.compile(r"[0-9]{1,18}")  # ASCII digits: "²".isdigit() holds, int("²") fails
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")
_NATURAL_PARTS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders node2 before node10 (and is total for any strings)."""
    parts = _NATURAL_PARTS.split(name)
    return tuple((0, int(p), len(p)) if i % 2 else (1, p, 0) for i, p in enumerate(parts))


def natural_sorted(names: Iterable[str]) -> list[str]:
    return sorted(names, key=natural_key)


def _split_top_level(expression: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for position, char in enumerate(expression):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {expression!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expression!r}")
        elif char == "," and depth == 0:
            items.append(expression[start:position])
            start = position + 1
    if depth != 0:
        raise HostlistError(f"unclosed '[' in hostlist {expression!r}")
    items.append(expression[start:])
    return items


def _expand_ranges(body: str, expression: str) -> list[str]:
    """Expand the inside of one bracket group, e.g. ``01-04,07``."""
    values: list[str] = []
    for part in body.split(","):
        low, dash, high = part.partition("-")
        if not _BOUND.fullmatch(low) or (dash and not _BOUND.fullmatch(high)):
            raise HostlistError(f"bad range {part!r} in hostlist {expression!r}")
        if not dash:
            values.append(low)
            continue
        first, last = int(low), int(high)
        if last < first:
            raise HostlistError(f"descending range {part!r} in hostlist {expression!r}")
        if last - first >= MAX_EXPANSION:
            raise HostlistError(f"range {part!r} too large in hostlist {expression!r}")
        width = len(low)
        values.extend(f"{number:0{width}d}" for number in range(first, last + 1))
    return values


def _expand_item(item: str, expression: str) -> list[str]:
    if not item:
        raise HostlistError(f"empty name in hostlist {expression!r}")
    names = [""]
    rest = item
    while rest:
        opening = rest.find("[")
        if opening < 0:
            literal, rest = rest, ""
            names = [name + literal for name in names]
            break
        closing = rest.find("]", opening)
        literal, body, rest = rest[:opening], rest[opening + 1 : closing], rest[closing + 1 :]
        values = _expand_ranges(body, expression)
        if len(names) * len(values) > MAX_EXPANSION:
            raise HostlistError(f"hostlist {expression!r} expands to too many names")
        names = [name + literal + value for name in names for value in values]
    return names


def expand_hostlist(expression: str) -> list[str]:
    """``"node[01-03],gpu7"`` -> ``["node01", "node02", "node03", "gpu7"]`` (order kept)."""
    expression = expression.strip()
    if not expression:
        return []
    if any(char.isspace() for char in expression):
        raise HostlistError(f"whitespace in hostlist {expression!r}")
    names: list[str] = []
    for item in _split_top_level(expression):
        names.extend(_expand_item(item, expression))
        if len(names) > MAX_EXPANSION:
            raise HostlistError(f"hostlist {expression!r} expands to too many names")
    return names


def _format_runs(numbers: list[int], width: int) -> str:
    runs, start, previous = [], numbers[0], numbers[0]
    for number in numbers[1:] + [None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        if start == previous:
            runs.append(f"{start:0{width}d}")
        else:
            runs.append(f"{start:0{width}d}-{previous:0{width}d}")
        if number is not None:
            start = previous = number
    return ",".join(runs)


def compress_hostlist(names: Iterable[str]) -> str:
    """Fold names into a Slurm hostlist; duplicates are dropped, output is naturally sorted.

    ``node08, node09, node10`` -> ``node[08-10]``: a number without a leading zero joins the
    widest padded group it fits, as Slurm does, so padding is never lost or invented.
    """
    unique = set(names)
    for name in unique:
        if not name or any(char in name for char in "[],") or any(c.isspace() for c in name):
            raise HostlistError(f"name {name!r} cannot appear in a hostlist")
    plain: list[str] = []
    padded_widths: dict[str, set[int]] = {}
    numbered: list[tuple[str, str]] = []
    for name in unique:
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.append(name)
            continue
        prefix, digits = match.groups()
        numbered.append((prefix, digits))
        if len(digits) > 1 and digits[0] == "0":
            padded_widths.setdefault(prefix, set()).add(len(digits))
    groups: dict[tuple[str, int], list[int]] = {}
    for prefix, digits in numbered:
        if len(digits) > 1 and digits[0] == "0":
            width = len(digits)
        else:
            fitting = [w for w in padded_widths.get(prefix, ()) if w <= len(digits)]
            width = max(fitting, default=1)
        groups.setdefault((prefix, width), []).append(int(digits))
    pieces: list[tuple[tuple, str]] = [(natural_key(name), name) for name in plain]
    for (prefix, width), numbers in groups.items():
        numbers.sort()
        if len(numbers) == 1:
            text = f"{prefix}{numbers[0]:0{width}d}"
        else:
            text = f"{prefix}[{_format_runs(numbers, width)}]"
        pieces.append((natural_key(f"{prefix}{numbers[0]:0{width}d}"), text))
    pieces.sort()
    return ",".join(text for _, text in pieces)

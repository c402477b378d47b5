"""Expand Slurm-style host lists: `gpu[01-64]`, `a[1-2]-b[01-02]`, `gpu[01-03,07],login1`.

A small copy of what `fabric/` knows, because the agent must not import the server apps.
"""

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """Every hostname `text` names, in order, without duplicates; ValueError if malformed."""
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        if not part:
            raise ValueError(f"empty host name in {text!r}")
        hosts.extend(_expand_one(part, text))
    return list(dict.fromkeys(hosts))


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


def _expand_one(pattern: str, whole: str) -> list[str]:
    """Expand the first bracket group, then the rest of the pattern recursively."""
    start = pattern.find("[")
    if start < 0:
        if "]" in pattern:
            raise ValueError(f"unbalanced ']' in {whole!r}")
        return [pattern]
    end = pattern.find("]", start)
    if end < 0 or "[" in pattern[start + 1 : end]:
        raise ValueError(f"unbalanced '[' in {whole!r}")
    prefix, body, rest = pattern[:start], pattern[start + 1 : end], pattern[end + 1 :]
    tails = _expand_one(rest, whole)
    return [prefix + number + tail for number in _numbers(body, whole) for tail in tails]


def _numbers(body: str, whole: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07']; zero padding follows the first number's width."""
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if not match:
            raise ValueError(f"bad range {item!r} in {whole!r}")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ValueError(f"range {item!r} runs backwards in {whole!r}")
        width = len(first)
        numbers.extend(str(n).zfill(width) for n in range(int(first), int(last) + 1))
    return numbers

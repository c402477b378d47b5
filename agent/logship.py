"""Ship each lease's log to `POST /api/v1/nodes/{id}/logs/`, about once a second.

Complete lines only while the command runs (the last, unfinished line waits for its newline);
the final partial line once it has ended. A line over 64 KiB is cut (the rest of it, up to its
newline, is dropped) and a request carries at most 2 MiB of lines. Line numbers start at 0.
The first request for a log is an empty probe: its `next_line` says how many lines the server
already has (0 for a fresh log; more after an agent restart), and those are skipped.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.client import ApiClient, ApiError, ServerTrouble, Unreachable

log = logging.getLogger("ibex-agent")

MAX_LINE = 64 * 1024
MAX_REQUEST = 2 * 1024 * 1024
READ_CHUNK = 1024 * 1024


@dataclass
class Cursor:
    offset: int = 0  # bytes of the file consumed
    line: int = 0  # the number of the next line in the file
    skip: int = 0  # lines the server already has: read past them without sending
    in_long_line: bool = False  # past the 64 KiB of a cut line, dropping up to its newline
    probed: bool = False
    done: bool = False  # ended and all shipped (or given up)
    failing: bool = False  # the last attempt failed: said once, until it works again


@dataclass
class Chunk:
    lines: list[str]
    offset: int
    in_long_line: bool


def read_lines(path: Path, offset: int, in_long_line: bool, ended: bool,
               chunk: int = READ_CHUNK) -> Chunk:
    """The next lines of `path` from byte `offset`, at most MAX_REQUEST bytes of them."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        data = handle.read(chunk)
    at_end = len(data) < chunk
    lines: list[str] = []
    size = 0
    position = 0
    while position < len(data):
        newline = data.find(b"\n", position)
        if newline == -1:
            rest = data[position:]
            if in_long_line:
                position = len(data)  # still inside a line already cut
            elif len(rest) >= MAX_LINE:
                lines.append(_cut(rest))
                in_long_line, position = True, len(data)
            elif ended and at_end:
                lines.append(_cut(rest))
                position = len(data)
            break
        raw = data[position:newline]
        if in_long_line:
            in_long_line = False
            position = newline + 1
            continue
        text = _cut(raw)
        length = len(text.encode())
        if lines and size + length > MAX_REQUEST:
            break
        lines.append(text)
        size += length
        position = newline + 1
    return Chunk(lines, offset + position, in_long_line)


def _cut(raw: bytes) -> str:
    """At most MAX_LINE bytes of UTF-8 (invalid bytes become U+FFFD, which takes 3)."""
    text = raw[:MAX_LINE].rstrip(b"\r").decode("utf-8", "replace")
    return text.encode()[:MAX_LINE].decode("utf-8", "ignore")


class LogShipper:
    def __init__(self, client: ApiClient, node_id: int, token: str,
                 sources: Callable[[], list[tuple[str, int, Path, bool]]]) -> None:
        self.client = client
        self.node_id = node_id
        self.token = token
        self.sources = sources
        self.cursors: dict[tuple[str, int], Cursor] = {}

    def drained(self, lease: str) -> bool:
        """Every log of `lease` has been shipped to its end (or given up)."""
        keys = [key for key in self.cursors if key[0] == lease]
        return bool(keys) and all(self.cursors[key].done for key in keys)

    def ship_all(self) -> None:
        listed = set()
        for lease, generation, path, ended in self.sources():
            listed.add((lease, generation))
            self.ship(lease, generation, path, ended)
        for key in list(self.cursors):
            if key not in listed:
                del self.cursors[key]

    def ship(self, lease: str, generation: int, path: Path, ended: bool) -> None:
        cursor = self.cursors.setdefault((lease, generation), Cursor())
        if cursor.done:
            return
        try:
            if not cursor.probed:
                cursor.skip = self._post(lease, generation, 0, [])
                cursor.probed = True
            while self._ship_chunk(lease, generation, path, ended, cursor):
                pass
            if cursor.failing:
                log.info("lease %s: log shipping works again", lease)
                cursor.failing = False
        except (Unreachable, ServerTrouble) as error:
            if not cursor.failing:
                log.warning("lease %s: cannot ship its log: %s; retrying", lease, error)
                cursor.failing = True
        except ApiError as error:
            log.warning("lease %s: the server refuses its log: %s; not shipping it", lease, error)
            cursor.done = True
        except OSError as error:
            log.warning("lease %s: cannot read %s: %s", lease, path, error.strerror)
            cursor.done = True

    def _ship_chunk(self, lease: str, generation: int, path: Path, ended: bool, cursor: Cursor) -> bool:
        """Send the next lines; True while there may be more to send now."""
        chunk = read_lines(path, cursor.offset, cursor.in_long_line, ended)
        skipped = min(cursor.skip, len(chunk.lines))
        lines = chunk.lines[skipped:]
        cursor.skip -= skipped
        cursor.line += skipped
        if lines:
            next_line = self._post(lease, generation, cursor.line, lines)
            cursor.line += len(lines)
            cursor.skip = max(0, next_line - cursor.line)
        progressed = chunk.offset != cursor.offset
        cursor.offset, cursor.in_long_line = chunk.offset, chunk.in_long_line
        if not progressed and ended:
            cursor.done = True
        return progressed

    def _post(self, lease: str, generation: int, from_line: int, lines: list[str]) -> int:
        body = {"lease": lease, "generation": generation, "from_line": from_line, "lines": lines}
        return self.client.post_logs(self.node_id, self.token, body)

"""The suite's clock: real by default, or shifted to another instant for the whole run.

    IBEX_TEST_CLOCK=2027-12-31T23:57:00Z make test

starts the run at that instant (ticking, with time-machine) in the pytest process and in every
Python process it starts: the worker, the agents, the embedded runtime and the harnesses get
`IBEX_TEST_CLOCK_OFFSET_S` and `tests/clock_site` on PYTHONPATH, whose `sitecustomize` moves
their clock by the same offset as soon as they start. So every process reads one clock, and a
run started a few minutes before midnight crosses midnight, a month's end or a year's end
while it runs. PostgreSQL's own `now()` is not shifted: IBEX never reads the database's clock
(every time is passed from Python), and neither may a test.

A test that needs a particular moment moves the clock itself (`time_machine.travel`), never
mixes a fixed date with the real one.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

CLOCK_ENV = "IBEX_TEST_CLOCK"
OFFSET_ENV = "IBEX_TEST_CLOCK_OFFSET_S"
SITE_DIR = Path(__file__).resolve().parent / "clock_site"


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant; one without a zone is UTC."""
    try:
        instant = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{CLOCK_ENV}={text!r} is not an ISO 8601 instant "
                         "(e.g. 2027-12-31T23:57:00Z)") from None
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def start_shifted_clock(text: str):
    """Travel to the instant `text` (ticking) here and in every child process; returns the
    traveller (stop it at the end of the run)."""
    import time_machine

    instant = parse_instant(text)
    offset = instant.timestamp() - time.time()
    os.environ[OFFSET_ENV] = repr(offset)
    os.environ["PYTHONPATH"] = python_path()
    traveller = time_machine.travel(instant, tick=True)
    traveller.start()
    time.time()  # time-machine ticks from the first reading: take it now, as the children do
    return traveller


def python_path(*first: str) -> str:
    """PYTHONPATH for a child process: `first`, then the shifted clock's site folder when the
    run is shifted, then what was there."""
    parts = [*first]
    if os.environ.get(OFFSET_ENV):
        parts.append(str(SITE_DIR))
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
              if p and p not in parts]
    return os.pathsep.join(parts)

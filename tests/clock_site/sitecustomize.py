"""Imported by every Python process of a shifted test run (tests/clock.py puts this folder on
PYTHONPATH): moves this process's clock by the run's offset before anything reads it."""

import os

_offset = os.environ.get("IBEX_TEST_CLOCK_OFFSET_S")
if _offset:
    import time

    import time_machine

    time_machine.travel(time.time() + float(_offset), tick=True).start()
    time.time()  # time-machine ticks from the first reading, not from the start of travel

"""A real Celery worker that pauses for a random moment before and after the steps that write
money and placements (test scaffolding for the crash harness, never used in production).

Placement, clearing, metering and payouts take microseconds between their writes on an idle
machine; these pauses stretch them so that a SIGKILL sent at a random moment lands inside the
transaction, between two Stripe calls or between a commit and the next step, not only between
tasks. Run: python -m tests.reliability.jitter_worker worker --pool solo --queues ...
"""

import functools
import os
import random
import sys
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
django.setup()

from billing import ledger, services  # noqa: E402
from ibex.celery import app  # noqa: E402
from market import leasing  # noqa: E402
from pool import services as pool  # noqa: E402

JITTER_S = float(os.environ.get("IBEX_CRASH_JITTER_MS", "30")) / 1000


def _jitter(module, name: str) -> None:
    original = getattr(module, name)

    @functools.wraps(original)
    def paused(*args, **kwargs):
        time.sleep(random.uniform(0, JITTER_S))
        result = original(*args, **kwargs)
        time.sleep(random.uniform(0, JITTER_S))
        return result

    setattr(module, name, paused)


for module, name in [(ledger, "post"), (pool, "bind_lease"), (leasing, "create_lease"),
                     (services, "record_usage"), (services, "create_payout")]:
    _jitter(module, name)

if __name__ == "__main__":
    app.worker_main(sys.argv[1:])

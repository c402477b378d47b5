"""`python -m tests.scheduler.paused_worker <celery arguments>`: a Celery worker whose
placements stop inside their transaction, after every write and before the commit, for
PAUSE_S, so that a test can kill the worker there (test_place_lease_crash.py).

The pause wraps `scheduler.placing.place_lease` in an outer transaction: the placement's own
transaction becomes a savepoint, so its writes and its row lock are all in place, uncommitted,
while the worker sleeps."""

import time

import django
from celery import signals
from celery.bin.celery import main

PAUSE_S = 120


@signals.worker_init.connect
def pause_inside_placements(**_kwargs) -> None:
    django.setup()
    from django.db import transaction

    from scheduler import placing

    place = placing.place_lease

    def place_then_pause(**kwargs):
        with transaction.atomic():
            lease = place(**kwargs)
            time.sleep(PAUSE_S)
            return lease

    placing.place_lease = place_then_pause


if __name__ == "__main__":
    main()

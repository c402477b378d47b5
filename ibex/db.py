"""Database helpers shared by every app."""

import functools
import random
import time

from django.db import OperationalError, connection
from psycopg import errors

BULK_ANALYZE_THRESHOLD = 200


def analyze_after_bulk_load(*models, rows: int) -> None:
    """Refresh the planner's statistics after a bulk load.

    A table filled in one go still looks empty to PostgreSQL until autovacuum analyses it,
    and the planner then picks nested loops that take a minute over a few hundred rows
    (seen with the demo's fresh GPU price table). Run inside the loading transaction, ANALYZE
    counts the transaction's own new rows.
    """
    if rows < BULK_ANALYZE_THRESHOLD:
        return
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f'ANALYZE "{model._meta.db_table}"')


def lock_until_commit(*names: str) -> None:
    """Take PostgreSQL advisory locks on `names`, in sorted order so that two callers naming
    the same locks never deadlock; they are released when the surrounding transaction ends.

    For work that reads shared state and then writes what it decided from it (matching an
    order against the free GPUs): a second caller waits and then reads what the first wrote,
    instead of deciding from the same stale picture and losing at the constraint."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_until_commit needs a transaction to hold the lock until")
    with connection.cursor() as cursor:
        for name in sorted(set(names)):
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])


DEADLOCK_RETRIES = 3


def retry_on_deadlock(function):
    """Run a service's transaction again when PostgreSQL chose it as a deadlock's victim (or
    refused it as a serialization failure): it was rolled back whole, so running it again is
    safe, and a client should not get a 500 for two orders crossing. Only the outermost
    transaction is retried; inside another one the error goes up to it."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        for attempt in range(DEADLOCK_RETRIES + 1):
            try:
                return function(*args, **kwargs)
            except OperationalError as exc:
                conflict = isinstance(exc.__cause__, errors.DeadlockDetected
                                      | errors.SerializationFailure)
                if not conflict or connection.in_atomic_block or attempt == DEADLOCK_RETRIES:
                    raise
                time.sleep(random.uniform(0.005, 0.05) * (attempt + 1))  # noqa: S311
    return run

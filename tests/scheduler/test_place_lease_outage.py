"""A placement that meets a database outage is retried until the database is back, never
dropped.

Real parts: PostgreSQL, Redis and a real `celery worker`. The worker connects as a role of its
own; the outage is that role refused at login with its connections cut (what a worker sees
while PostgreSQL restarts), so the test's own connection stays up to watch. Before the fix the
task's retry asked the database for the lease's fabric (to route the retry) while it was
still away, and Celery drops a message whose retry cannot be sent: the lease stayed pending
until a sweep found it.
"""

import time
import uuid

import pytest
from django.db import connection

from market.models import Lease
from pool import services as pool
from tests.conftest import database_url_for
from tests.scheduler.test_place_lease_crash import DEADLINE_S, an_order_filled, wait_for

OUTAGE_S = 4


@pytest.fixture
def worker_role():
    """A login role with read and write rights on every table, for the worker alone."""
    name = f"ibex_outage_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} LOGIN")
        cursor.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {name}")
    yield name
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE usename = %s", [name])
        cursor.execute(f"DROP ROLE {name}")


def set_database_away(role: str, away: bool) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {role} {'NOLOGIN' if away else 'LOGIN'}")
        if away:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE usename = %s", [role])


@pytest.mark.django_db(transaction=True)
def test_a_placement_that_meets_a_database_outage_is_retried_not_dropped(
        queue, workers, worker_role):
    pool.ensure_gpu_catalogue()
    settings_dict = {**connection.settings_dict, "USER": worker_role, "PASSWORD": ""}
    workers(queue, f"{queue}-w", DATABASE_URL=database_url_for(settings_dict))
    set_database_away(worker_role, True)

    lease = an_order_filled()  # its placement message reaches the worker during the outage
    time.sleep(OUTAGE_S)
    assert Lease.objects.get(pk=lease.pk).state == "pending"
    set_database_away(worker_role, False)

    wait_for(lambda: Lease.objects.get(pk=lease.pk).state == "placing",
             f"the retried placement (within {DEADLINE_S} s, no sweep)")

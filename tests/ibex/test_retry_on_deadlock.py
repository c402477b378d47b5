"""A service chosen as a deadlock's victim runs again (it was rolled back whole) instead of
answering a 500; inside another transaction, and for any other error, nothing is retried."""

import pytest
from django.db import OperationalError, transaction
from psycopg import errors

from ibex.db import DEADLOCK_RETRIES, retry_on_deadlock


def failing(times: int, cause: Exception):
    calls = []

    @retry_on_deadlock
    def service():
        calls.append(1)
        if len(calls) <= times:
            raise OperationalError("deadlock detected") from cause
        return "done"

    return service, calls


def test_a_deadlocked_service_runs_again_and_succeeds(transactional_db):
    service, calls = failing(2, errors.DeadlockDetected("deadlock detected"))

    assert service() == "done"
    assert len(calls) == 3


def test_it_gives_up_after_its_retries(transactional_db):
    service, calls = failing(DEADLOCK_RETRIES + 1, errors.SerializationFailure("conflict"))

    with pytest.raises(OperationalError):
        service()
    assert len(calls) == DEADLOCK_RETRIES + 1


def test_inside_another_transaction_the_error_goes_up_at_once(transactional_db):
    service, calls = failing(1, errors.DeadlockDetected("deadlock detected"))

    with pytest.raises(OperationalError), transaction.atomic():
        service()
    assert len(calls) == 1


def test_other_database_errors_are_not_retried(transactional_db):
    service, calls = failing(1, errors.AdminShutdown("terminating connection"))

    with pytest.raises(OperationalError):
        service()
    assert len(calls) == 1

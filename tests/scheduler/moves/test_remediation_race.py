import threading

import pytest
from django.db import connection
from django.utils import timezone

from market.models import Allocation, LeaseEvent
from scheduler.moves import remediation
from tests.scheduler.moves.test_remediation import active_lease, fail_all, setup_market


@pytest.mark.django_db(transaction=True)
def test_two_workers_remediating_at_once_move_each_lease_once(monkeypatch):
    # two leases a transaction: the workers interleave, each with its own (soon stale) index
    # of the free GPUs, so they race for the same replacements
    monkeypatch.setattr(remediation, "CHUNK", 2)
    client = setup_market()
    leases = [active_lease(client, gpus=1) for _ in range(12)]
    fail_all([Allocation.objects.get(lease=lease).gpu for lease in leases])
    barrier = threading.Barrier(2)
    outcomes, failed = [], []

    def worker():
        try:
            barrier.wait()
            outcomes.append(remediation.remediate_leases())
        except Exception as exc:  # any failure fails the test below
            failed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    leftover = remediation.remediate_leases()  # a lease both skipped is the next pass's

    assert failed == []
    now = timezone.now()
    for lease in leases:
        assert LeaseEvent.objects.filter(lease=lease, kind="moved").count() == 1
        (gpu,) = Allocation.objects.filter(lease=lease, period__contains=now).values_list(
            "gpu__health", flat=True)
        assert gpu == "ok"
    held = list(Allocation.objects.filter(period__contains=now).values_list("gpu_id", flat=True))
    assert len(held) == len(set(held))
    assert {lease for result in [*outcomes, leftover] for lease, v in result.items()
            if v == "moved"} == {lease.pk for lease in leases}

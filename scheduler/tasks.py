from celery import shared_task
from django.db import OperationalError

from scheduler import services


@shared_task(name="scheduler.place_lease", acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(OperationalError,), retry_backoff=True, retry_backoff_max=60,
             max_retries=8)
def place_lease(lease_id: int) -> str:
    # Idempotent (a lease placed twice is bound once) and acknowledged late: a worker killed
    # mid-task leaves the message to the next worker, which finishes the job.
    return services.place_lease(lease_id=lease_id).state


@shared_task(name="scheduler.activate_acknowledged_leases")
def activate_acknowledged_leases() -> list[int]:
    return services.activate_acknowledged_leases()


@shared_task(name="scheduler.fail_stuck_leases")
def fail_stuck_leases() -> list[int]:
    return services.fail_stuck_leases()

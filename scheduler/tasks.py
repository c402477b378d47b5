from celery import shared_task

from scheduler import services


@shared_task(name="scheduler.place_lease", acks_late=True)
def place_lease(lease_id: int) -> str:
    return services.place_lease(lease_id=lease_id).state


@shared_task(name="scheduler.activate_acknowledged_leases")
def activate_acknowledged_leases() -> list[int]:
    return services.activate_acknowledged_leases()

"""The scheduler's Celery tasks: thin wrappers over the rooms, which hold the logic. The task
names are the wire contract with the beat and with queued messages. The rooms never import
this module: what they must queue goes through the outbox by task name."""

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError

from scheduler import guarantees, placing, sla
from scheduler.moves import defrag, drain, remediation
from scheduler.pools import admission, tides


@shared_task(name="scheduler.place_lease", bind=True, acks_late=True, reject_on_worker_lost=True,
             autoretry_for=(OperationalError, InterfaceError), retry_backoff=True, retry_backoff_max=60,
             max_retries=8)
def place_lease(self, lease_id: int) -> str:
    # Idempotent (a lease placed twice is placed once), one transaction, acknowledged late: a
    # worker killed mid-task leaves nothing half-done and the message to the next worker.
    # Routed to its fabric's partition queue (scheduler/routing.py).
    attempt = self.request.retries + 1
    if not placing.lease_exists(lease_id=lease_id):
        return "no such lease"
    try:
        lease = placing.place_lease(lease_id=lease_id,
                                     final=attempt >= settings.PLACEMENT_ATTEMPTS)
    except placing.NoPlacement as exc:
        countdown = min(settings.PLACEMENT_BACKOFF_BASE_S * 2 ** (attempt - 1),
                        settings.PLACEMENT_BACKOFF_CAP_S)
        raise self.retry(countdown=countdown, max_retries=settings.PLACEMENT_ATTEMPTS,
                         exc=exc) from None
    return lease.state


@shared_task(name="scheduler.activate_acknowledged_leases")
def activate_acknowledged_leases() -> list[int]:
    return placing.activate_acknowledged_leases()


@shared_task(name="scheduler.requeue_unplaced_leases")
def requeue_unplaced_leases() -> list[int]:
    """Queue placement again for leases whose message was lost (beat: every 30 s)."""
    lease_ids = placing.requeue_unplaced_leases()
    for lease_id in lease_ids:
        place_lease.delay(lease_id)
    return lease_ids


@shared_task(name="scheduler.replace_unacknowledged_leases")
def replace_unacknowledged_leases() -> list[int]:
    """Place again leases a silent node did not acknowledge (beat: every 10 s)."""
    return placing.replace_unacknowledged_leases()


@shared_task(name="scheduler.fail_stuck_leases")
def fail_stuck_leases() -> list[int]:
    return placing.fail_stuck_leases()


# --- SLAs and remediation (tenant events and webhooks: notify/tasks.py) -----------------------


@shared_task(name="scheduler.evaluate_slas")
def evaluate_slas() -> list[int]:
    """Measure active and recently ended leases and credit breaches (beat: every 60 s)."""
    return sla.evaluate_slas()


@shared_task(name="scheduler.recheck_guarantees")
def recheck_guarantees(fabric_id: int | None = None) -> dict:
    """Guarantees checked again on the fabric's routes (after a report changed them, and every
    minute for every fabric as a safety net)."""
    return {str(k): v for k, v in guarantees.recheck_guarantees(fabric_id=fabric_id).items()}


@shared_task(name="scheduler.remediate_leases")
def remediate_leases() -> dict:
    return {str(k): v for k, v in remediation.remediate_leases().items()}


# --- private pools: admission and tidal schedules ---------------------------------------------


@shared_task(name="scheduler.admit_pool", acks_late=True)
def admit_pool(pool_id: int) -> list[int]:
    """One admission pass over a private pool (queued when an order arrives)."""
    return admission.admit_pool(pool_id=pool_id).admitted


@shared_task(name="scheduler.admit_pools")
def admit_pools() -> dict[str, int]:
    """Every private pool's admission pass (beat: every 10 s)."""
    return admission.admit_all_pools()


@shared_task(name="scheduler.apply_tidal_steps")
def apply_tidal_steps() -> list[int]:
    """Apply the tidal schedule steps that are due (beat: every 30 s)."""
    return [run.pk for run in tides.apply_due_steps()]


@shared_task(name="scheduler.drain_nodes")
def drain_nodes() -> dict:
    """Move leases off nodes drained in `move` mode; empty draining nodes go offline."""
    return drain.drain_nodes()


@shared_task(name="scheduler.defragment")
def defragment() -> dict:
    """Move consenting spot leases so that whole free leaves and nodes form again."""
    run = defrag.defragment(max_moves=settings.DEFRAG_MAX_MOVES)
    return {"run": run.pk, "moves": run.moves_applied,
            "whole_free_leaves": [run.whole_free_leaves_before, run.whole_free_leaves_after],
            "whole_free_nodes": [run.whole_free_nodes_before, run.whole_free_nodes_after]}

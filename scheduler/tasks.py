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


# --- SLAs, events and webhooks ----------------------------------------------------------------


@shared_task(name="scheduler.evaluate_slas")
def evaluate_slas() -> list[int]:
    """Measure active and recently ended leases and credit breaches (beat: every 60 s)."""
    from scheduler import sla

    return sla.evaluate_slas()


@shared_task(name="scheduler.sync_events")
def sync_events() -> int:
    """Lease state changes and health events → tenant events (beat: every 10 s)."""
    from scheduler import events

    return events.sync_events()


@shared_task(name="scheduler.fan_out_events")
def fan_out_events() -> int:
    """Create missing webhook deliveries and queue the due ones (after commit, and by beat)."""
    from scheduler import webhooks

    due = webhooks.fan_out()
    for delivery_id in due:
        deliver_webhook.delay(delivery_id)
    return len(due)


@shared_task(name="scheduler.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: int) -> str:
    from scheduler import webhooks

    outcome = webhooks.deliver(delivery_id=delivery_id)
    if outcome is None:
        return "not due"
    if outcome.retry_in is not None:
        deliver_webhook.apply_async(args=[delivery_id],
                                    countdown=outcome.retry_in.total_seconds())
    return outcome.state


@shared_task(name="scheduler.remediate_leases")
def remediate_leases() -> dict:
    from scheduler import remediation

    return {str(k): v for k, v in remediation.remediate_leases().items()}


@shared_task(name="scheduler.drain_nodes")
def drain_nodes() -> dict:
    """Move leases off nodes drained in `move` mode; empty draining nodes go offline."""
    from scheduler import drain

    return drain.drain_nodes()


@shared_task(name="scheduler.defragment")
def defragment() -> dict:
    """Move consenting spot leases so that whole free leaves and nodes form again."""
    from django.conf import settings

    from scheduler import defrag

    run = defrag.defragment(max_moves=settings.DEFRAG_MAX_MOVES)
    return {"run": run.pk, "moves": run.moves_applied,
            "whole_free_leaves": [run.whole_free_leaves_before, run.whole_free_leaves_after],
            "whole_free_nodes": [run.whole_free_nodes_before, run.whole_free_nodes_after]}

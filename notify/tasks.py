"""Notification's Celery tasks. Their names keep the `scheduler.` prefix they were first
published under: the beat schedule and messages already queued carry those names."""

from celery import shared_task

from notify import events, webhooks


@shared_task(name="scheduler.sync_events")
def sync_events() -> int:
    """Lease state changes and health events → tenant events (beat: every 10 s)."""
    return events.sync_events()


@shared_task(name="scheduler.fan_out_events")
def fan_out_events() -> int:
    """Create missing webhook deliveries and queue the due ones (after commit, and by beat)."""
    due = webhooks.fan_out()
    for delivery_id in due:
        deliver_webhook.delay(delivery_id)
    return len(due)


@shared_task(name="scheduler.deliver_webhook", acks_late=True)
def deliver_webhook(delivery_id: int) -> str:
    outcome = webhooks.deliver(delivery_id=delivery_id)
    if outcome is None:
        return "not due"
    if outcome.retry_in is not None:
        deliver_webhook.apply_async(args=[delivery_id],
                                    countdown=outcome.retry_in.total_seconds())
    return outcome.state

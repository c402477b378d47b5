"""Platform tasks: a round trip for health checks, and beat's own pulse."""

import time

from celery import shared_task
from django.core.cache import cache

BEAT_KEY = "ibex:beat:last"


@shared_task(name="ibex.ping")
def ping(payload: str = "pong") -> dict:
    """Echo a payload with the worker's clock: proves a worker took the task and answered."""
    return {"payload": payload, "answered_at": time.time()}


@shared_task(name="ibex.record_beat")
def record_beat() -> float:
    """Run by beat every 30 s; /readyz shows how long ago beat last ticked."""
    now = time.time()
    cache.set(BEAT_KEY, now, timeout=None)
    return now


@shared_task(name="ibex.relay_outbox")
def relay_outbox() -> int:
    """Beat's safety net: whatever the after-commit relay could not send, send now."""
    from ibex.outbox.services import relay_pending

    return relay_pending()

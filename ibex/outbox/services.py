"""The transactional outbox: a task is recorded in PostgreSQL in the same transaction as the
change that needs it, then relayed to the broker after commit. When the broker (Redis) is
down the row waits, and the relay sends it once the broker is back; nothing is lost.

Tasks relayed through here must tolerate being delivered twice (a relay that dies between
sending and marking sent sends again): every IBEX task is idempotent.
"""

from __future__ import annotations

import logging

import redis
from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from ibex.outbox.models import OutboxMessage

log = logging.getLogger(__name__)
RELAY_BATCH = 500


def enqueue(task: str, *args) -> OutboxMessage:
    """Record a task inside the caller's transaction; it is sent when that commits."""
    message = OutboxMessage.objects.create(task=task, args=list(args))
    # robust: the change has committed; if relaying now fails (PostgreSQL gone between the
    # commit and the relay), the request must not fail with it: the relay beat sends it later.
    transaction.on_commit(lambda: relay_one(message.pk), robust=True)
    return message


_pinger: dict[str, redis.Redis] = {}


def broker_answers() -> bool:
    """A quick ping first: a publish to a dead broker retries its connection for seconds.
    (One client per process: its pooled connection is reused from one message to the next.)"""
    url = settings.CELERY_BROKER_URL
    if url not in _pinger:
        _pinger[url] = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        return bool(_pinger[url].ping())
    except (redis.RedisError, OSError):
        return False


def relay_one(message_id: int) -> bool:
    """Send one message if nobody has; True when it is (now) sent."""
    if current_app.conf.task_always_eager:
        return _run_eagerly(message_id)
    own_transaction = not connection.in_atomic_block
    with transaction.atomic():
        if own_transaction:
            # Marking a message sent need not wait for the disk: were that mark lost in a
            # crash, the relay would send the message again, which every task tolerates.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        message = OutboxMessage.objects.select_for_update(skip_locked=True).filter(
            pk=message_id, sent_at__isnull=True).first()
        if message is None:
            return False  # sent already, or another relay holds it
        error = None if broker_answers() else "the broker does not answer"
        if error is None:
            try:
                current_app.send_task(message.task, args=message.args, retry=False)
            except Exception as exc:  # noqa: BLE001 - a down broker shows as many error types
                # (kombu OperationalError, RuntimeError after its connection retries,
                # OSError); whatever it is, the message stays here for the next relay.
                error = str(exc)[:500] or type(exc).__name__
        if error is not None:
            OutboxMessage.objects.filter(pk=message.pk).update(
                attempts=message.attempts + 1, last_error=error)
            log.warning("outbox: %s not sent yet (%s)", message, error)
            return False
        OutboxMessage.objects.filter(pk=message.pk).update(
            sent_at=timezone.now(), attempts=message.attempts + 1, last_error="")
        return True


def _run_eagerly(message_id: int) -> bool:
    """Eager mode (tests, debugging): `send_task` ignores it where `delay` would not, so run
    the task here, after marking the message sent and outside any transaction."""
    claimed = OutboxMessage.objects.filter(pk=message_id, sent_at__isnull=True).update(
        sent_at=timezone.now(), attempts=F("attempts") + 1)
    if not claimed:
        return False
    message = OutboxMessage.objects.get(pk=message_id)
    current_app.tasks[message.task].apply(args=message.args)
    return True


def relay_pending() -> int:
    """Send everything still waiting, oldest first; safe to run in several processes."""
    sent = 0
    pending = OutboxMessage.objects.filter(sent_at__isnull=True).order_by("pk").values_list(
        "pk", flat=True)[:RELAY_BATCH]
    for message_id in list(pending):
        if relay_one(message_id):
            sent += 1
        elif OutboxMessage.objects.filter(pk=message_id, sent_at__isnull=True).exists():
            break  # the broker is still down: try again at the next round
    return sent

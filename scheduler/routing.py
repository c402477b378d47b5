"""Placement work is partitioned by fabric: `scheduler.place_lease` goes to one of
PLACEMENT_PARTITIONS queues, `<default queue>.place-<fabric id mod N>`, so that each fabric's
placements queue in one partition and workers on more machines can take a subset each
(`celery -A ibex worker -Q ibex.place-0,ibex.place-1`). A worker started without `-Q`
consumes the default queue and every partition (`CELERY_TASK_QUEUES` in the settings).

The queue names follow the default queue, so a test worker on a queue of its own
(`CELERY_QUEUE`) gets its own partitions too (`worker_queues`).

Routing must not need the database where the database may be away: a retry keeps the queue
its message came from (Celery passes the delivery's routing key), and a lookup that fails
routes to partition 0 rather than raise. Celery drops a message whose retry cannot be sent, so
a router that raised while PostgreSQL restarted lost the placement.
"""

from __future__ import annotations

import logging

from celery import current_app
from django.conf import settings
from django.db import DatabaseError

PLACE_TASK = "scheduler.place_lease"
log = logging.getLogger(__name__)


def partition_queue(default_queue: str, partition: int) -> str:
    return f"{default_queue}.place-{partition}"


def worker_queues(default_queue: str, partitions: int | None = None) -> list[str]:
    """Every queue a worker takes all the work from: the default one and each partition."""
    count = settings.PLACEMENT_PARTITIONS if partitions is None else partitions
    return [default_queue] + [partition_queue(default_queue, k) for k in range(count)]


def fabric_of_lease(lease_id: int) -> int | None:
    from market.models import Allocation

    return (Allocation.objects.filter(lease_id=lease_id).order_by()
            .values_list("gpu__node__fabric_id", flat=True).first())


def route_task(name, args, kwargs, options, task=None, **_kw):
    """Celery router (CELERY_TASK_ROUTES): a placement goes to its fabric's partition."""
    if name != PLACE_TASK or settings.PLACEMENT_PARTITIONS < 1:
        return None
    if (options or {}).get("routing_key"):
        return None  # a retry: it stays on the queue it was delivered from
    lease_id = (args or [None])[0] if args else (kwargs or {}).get("lease_id")
    try:
        fabric_id = fabric_of_lease(int(lease_id)) if lease_id is not None else None
    except DatabaseError as exc:
        log.warning("placement of lease %s routed to partition 0: %s", lease_id, exc)
        fabric_id = None
    partition = (fabric_id or 0) % settings.PLACEMENT_PARTITIONS
    return {"queue": partition_queue(current_app.conf.task_default_queue, partition)}

"""What the operations dashboard shows, read from the database, Redis and the Celery workers.

Pool utilisation over time comes from the allocations themselves (GPUs held by a lease at each
hour), so no sampling table is needed; fragmentation is counted by the pure `fragmentation`
below from plain per-node rows.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Max, Min, Q, Sum
from django.utils import timezone

from ibex.celery import app as celery_app
from ibex.outbox.models import OutboxMessage
from market.models import Allocation, Clearing
from notify.models import WebhookDelivery
from pool.models import Gpu, Node
from scheduler.core.placement.defrag import whole_free_leaves
from scheduler.models import SlaCredit

IN_SERVICE = (Node.State.ACTIVE, Node.State.DRAINING)
WORKERS_CACHE_KEY = "web:ops:workers"
WORKERS_CACHE_S = 15
PING_TIMEOUT_S = 0.5


# --- utilisation --------------------------------------------------------------------------------


@dataclass(frozen=True)
class UtilisationSample:
    at: datetime
    leased: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 * self.leased / self.total if self.total else 0.0


def gpus_in_service() -> int:
    return Gpu.objects.filter(node__state__in=IN_SERVICE).count()


def utilisation(*, hours: int = 24, now: datetime | None = None) -> list[UtilisationSample]:
    """GPUs held by some lease at each whole hour of the last `hours`, and now (one query: a
    series of moments joined to the allocations whose period contains each)."""
    now = now or timezone.now()
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours - 1)
    table = Allocation._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"""
            SELECT moment, count(a.id)
              FROM (SELECT generate_series(%s::timestamptz, %s::timestamptz, interval '1 hour')
                    AS moment UNION SELECT %s::timestamptz) AS moments
              LEFT JOIN {table} a ON a.period @> moments.moment
             GROUP BY moment ORDER BY moment""", [start, now, now])  # noqa: S608 - table name
        rows = cursor.fetchall()
    total = gpus_in_service()
    return [UtilisationSample(at=moment, leased=leased, total=total) for moment, leased in rows]


# --- fragmentation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeFree:
    """One node as fragmentation sees it (plain data)."""

    fabric: str
    leaf: str
    gpus: int
    leased: int
    usable: bool  # in service (active, reachable) with every GPU healthy

    @property
    def whole_free(self) -> bool:
        return self.usable and self.leased == 0


@dataclass
class FabricFragmentation:
    fabric: str
    nodes: int = 0
    gpus: int = 0
    free_gpus: int = 0
    whole_free_nodes: int = 0
    leaves: int = 0
    whole_free_leaves: int = 0
    gpus_in_whole_free_nodes: int = 0

    @property
    def stranded_gpus(self) -> int:
        """Free GPUs on nodes that are partly leased (or not fully usable): hard to sell to a
        job that wants whole nodes."""
        return self.free_gpus - self.gpus_in_whole_free_nodes

    @property
    def fragmentation_percent(self) -> float:
        return 100.0 * self.stranded_gpus / self.free_gpus if self.free_gpus else 0.0


def fragmentation(nodes: list[NodeFree]) -> list[FabricFragmentation]:
    """Per fabric: free GPUs, whole free nodes (usable, nothing leased) and whole free leaves
    (every node under the leaf whole free). Pure: plain rows in, plain rows out."""
    fabrics: dict[str, FabricFragmentation] = {}
    for node in nodes:
        row = fabrics.setdefault(node.fabric, FabricFragmentation(node.fabric))
        row.nodes += 1
        row.gpus += node.gpus
        if node.usable:
            row.free_gpus += max(0, node.gpus - node.leased)
        if node.whole_free:
            row.whole_free_nodes += 1
            row.gpus_in_whole_free_nodes += node.gpus
    leaves = whole_free_leaves(((node.fabric, node.leaf), node.whole_free) for node in nodes)
    for (fabric, _leaf), free in leaves.items():
        fabrics[fabric].leaves += 1
        fabrics[fabric].whole_free_leaves += int(free)
    return [fabrics[name] for name in sorted(fabrics)]


def fragmentation_now(now: datetime | None = None) -> list[FabricFragmentation]:
    now = now or timezone.now()
    leased = dict(Allocation.objects.filter(period__contains=now)
                  .values_list("gpu__node_id").annotate(n=Count("id")))
    rows = (Node.objects.filter(state__in=IN_SERVICE)
            .annotate(gpu_total=Count("gpus"),
                      gpu_bad=Count("gpus", filter=~Q(gpus__health=Gpu.Health.OK)))
            .values_list("pk", "fabric__name", "host__leaf", "gpu_total", "gpu_bad", "state",
                         "health"))
    return fragmentation([
        NodeFree(fabric=fabric, leaf=leaf, gpus=total, leased=leased.get(pk, 0),
                 usable=state == Node.State.ACTIVE and health == Node.Health.REACHABLE
                 and bad == 0)
        for pk, fabric, leaf, total, bad, state, health in rows])


# --- auctions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MarketAuctions:
    gpu_model: str
    clearings: int
    gpus_sold: int
    low_micros: int | None
    high_micros: int | None
    last_micros: int | None


def auctions_since(since: datetime) -> list[MarketAuctions]:
    summary = (Clearing.objects.filter(cleared_at__gte=since).values("gpu_model")
               .annotate(n=Count("id"), sold=Sum("gpus_sold"), low=Min("price_micros"),
                         high=Max("price_micros")).order_by("gpu_model"))
    last = {}
    for model, price in (Clearing.objects.filter(cleared_at__gte=since,
                                                 price_micros__isnull=False)
                         .order_by("gpu_model", "-interval_start")
                         .distinct("gpu_model").values_list("gpu_model", "price_micros")):
        last[model] = price
    return [MarketAuctions(row["gpu_model"], row["n"], row["sold"] or 0, row["low"], row["high"],
                           last.get(row["gpu_model"])) for row in summary]


def recent_clearings(limit: int = 12):
    return list(Clearing.objects.order_by("-cleared_at")[:limit])


# --- SLAs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlaSummary:
    credits: int
    leases: int
    amount_micros: int
    recent: list = field(default_factory=list)


def sla_since(since: datetime, recent: int = 8) -> SlaSummary:
    rows = SlaCredit.objects.filter(created_at__gte=since)
    totals = rows.aggregate(n=Count("id"), leases=Count("lease", distinct=True),
                            amount=Sum("amount_micros"))
    return SlaSummary(credits=totals["n"], leases=totals["leases"],
                      amount_micros=totals["amount"] or 0,
                      recent=list(rows.select_related("lease__tenant")
                                  .order_by("-created_at")[:recent]))


# --- Celery, Redis and the outbox -----------------------------------------------------------------


@dataclass(frozen=True)
class QueueDepth:
    name: str
    depth: int | None  # None: Redis did not answer
    error: str = ""


def queue_names() -> list[str]:
    """The queue tasks are sent to (CELERY_QUEUE), its placement partitions (one per group of
    fabrics), and Celery's own default."""
    from scheduler.routing import worker_queues

    names = worker_queues(celery_app.conf.task_default_queue)
    return names if "celery" in names else [*names, "celery"]


def queue_depths() -> list[QueueDepth]:
    """LLEN of each Celery queue's Redis list (the messages waiting for a worker)."""
    try:
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL, socket_timeout=1,
                                      socket_connect_timeout=1)
        return [QueueDepth(name, int(client.llen(name))) for name in queue_names()]
    except redis.RedisError as exc:
        return [QueueDepth(name, None, f"{type(exc).__name__}: {exc}") for name in queue_names()]


@dataclass(frozen=True)
class Workers:
    names: list[str]
    checked_at: float
    error: str = ""

    @property
    def healthy(self) -> bool:
        return bool(self.names)

    @property
    def age_s(self) -> int:
        return int(time.time() - self.checked_at)


def _ping_workers() -> Workers:
    try:
        replies = celery_app.control.ping(timeout=PING_TIMEOUT_S)
    except Exception as exc:  # the broker down, a timeout: the dashboard shows the failure
        return Workers([], time.time(), f"{type(exc).__name__}: {exc}")
    names = sorted(name for reply in replies for name in reply)
    return Workers(names, time.time(), "" if names else "no worker answered a ping")


def workers(*, refresh: bool = False) -> Workers:
    """The workers that answered a ping, cached for a few seconds so a busy dashboard does not
    broadcast a ping per view."""
    try:
        cached = None if refresh else cache.get(WORKERS_CACHE_KEY)
    except Exception:  # Redis down: ask the workers (the ping reports the broker)
        cached = None
    if cached is not None:
        return Workers(**cached)
    found = _ping_workers()
    try:
        cache.set(WORKERS_CACHE_KEY, {"names": found.names, "checked_at": found.checked_at,
                                      "error": found.error}, WORKERS_CACHE_S)
    except Exception:  # noqa: S110 - the cache is an optimisation only
        pass
    return found


def outbox_backlog() -> int:
    return OutboxMessage.objects.filter(sent_at__isnull=True).count()


def webhook_backlog() -> dict[str, int]:
    counts = defaultdict(int, WebhookDelivery.objects.filter(
        state__in=[WebhookDelivery.State.PENDING, WebhookDelivery.State.FAILED])
        .values_list("state").annotate(n=Count("id")))
    return {"pending": counts["pending"], "failed": counts["failed"]}

"""How reliable each provider has been: the measured availability of its GPUs over a window
(30 days by default), from the pool's health events, in one SQL query.

Nothing else measured availability per provider (the SLA measures one lease at a time,
`scheduler/sla.py`), so this counts it with the SLA's rules (`scheduler/core/sla.py`), over
every GPU of the provider's nodes that are not retired:

- a node is down from its `node_unreachable` event less the heartbeats it missed
  (UNREACHABLE_AFTER_INTERVALS × its interval, never before its previous event) until its next
  node event (`node_reachable`), or until now;
- a GPU is down from a `gpu_health` event to `failed` until its next event to `ok`, or now;
- each node counts from the later of the window's start and its registration.

availability = 1 − down GPU-seconds / GPU-seconds in the window, clipped to [0, 1] and rounded
half to even to four places. A GPU down both ways at once counts twice (the clip keeps the
figure sane); a provider with no GPU-seconds in the window (no nodes) has None. Events from
before the window are read back one more window, so a node down since before the window
counts from the window's start.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from django.db import connection
from django.utils import timezone

from ibex.caching import remembered
from pool.services import UNREACHABLE_AFTER_INTERVALS

WINDOW = timedelta(days=30)
PLACES = Decimal("0.0001")
CACHE_S = 60  # a 30-day figure moves little in a minute; the offers page asks often
CACHE_KEY = "ibex:provider-reliability"

_SQL = """
WITH nodes AS MATERIALIZED (
    SELECT n.id, n.provider_id, n.heartbeat_interval_s,
           GREATEST(n.created_at, %(lo)s) AS since, g.gpus
      FROM pool_node n
      JOIN (SELECT node_id, count(*) AS gpus FROM pool_gpu GROUP BY node_id) g
        ON g.node_id = n.id
     WHERE n.state <> 'retired' AND n.created_at < %(hi)s {providers}
), node_events AS (
    SELECT e.node_id, e.kind, e.at,
           LAG(e.at) OVER w AS previous_at, LEAD(e.at) OVER w AS next_at
      FROM pool_healthevent e
     WHERE e.gpu_id IS NULL AND e.kind IN ('node_unreachable', 'node_reachable')
       AND e.at >= %(lookback)s AND e.at <= %(hi)s
       AND e.node_id IN (SELECT id FROM nodes)
    WINDOW w AS (PARTITION BY e.node_id ORDER BY e.at, e.id)
), node_down AS (
    SELECT nodes.provider_id, nodes.gpus * EXTRACT(EPOCH FROM
               LEAST(COALESCE(ev.next_at, %(hi)s), %(hi)s)
               - GREATEST(ev.at - nodes.heartbeat_interval_s * %(missed)s * INTERVAL '1 second',
                          COALESCE(ev.previous_at, ev.at - INTERVAL '100 years'), nodes.since)
           ) AS seconds
      FROM node_events ev JOIN nodes ON nodes.id = ev.node_id
     WHERE ev.kind = 'node_unreachable'
), gpu_events AS (
    SELECT g.node_id, e.to_value, e.at, LEAD(e.at) OVER w AS next_at
      FROM pool_healthevent e JOIN pool_gpu g ON g.id = e.gpu_id
     WHERE e.kind = 'gpu_health' AND e.to_value IN ('failed', 'ok')
       AND e.at >= %(lookback)s AND e.at <= %(hi)s
       AND g.node_id IN (SELECT id FROM nodes)
    WINDOW w AS (PARTITION BY e.gpu_id ORDER BY e.at, e.id)
), gpu_down AS (
    SELECT nodes.provider_id, EXTRACT(EPOCH FROM
               LEAST(COALESCE(ev.next_at, %(hi)s), %(hi)s) - GREATEST(ev.at, nodes.since)
           ) AS seconds
      FROM gpu_events ev JOIN nodes ON nodes.id = ev.node_id
     WHERE ev.to_value = 'failed'
), down AS (
    SELECT provider_id, GREATEST(seconds, 0) AS seconds FROM node_down
    UNION ALL
    SELECT provider_id, GREATEST(seconds, 0) FROM gpu_down
), total AS (
    SELECT provider_id, SUM(gpus * EXTRACT(EPOCH FROM %(hi)s - since)) AS seconds
      FROM nodes GROUP BY provider_id
)
SELECT total.provider_id, total.seconds,
       COALESCE((SELECT SUM(down.seconds) FROM down
                  WHERE down.provider_id = total.provider_id), 0)
  FROM total
"""


def provider_reliability(*, now: datetime | None = None, window: timedelta = WINDOW,
                         provider_ids: list[int] | None = None) -> dict[int, Decimal | None]:
    """Provider id → its GPUs' measured availability over the window ending now, as a
    fraction with four places (None: nothing to measure). One query."""
    hi = now or timezone.now()
    params = {"lo": hi - window, "hi": hi, "lookback": hi - 2 * window,
              "missed": UNREACHABLE_AFTER_INTERVALS, "providers": provider_ids}
    providers = "AND n.provider_id = ANY(%(providers)s)" if provider_ids is not None else ""
    with connection.cursor() as cursor:
        cursor.execute(_SQL.format(providers=providers), params)
        rows = cursor.fetchall()
    return {provider_id: availability(total, down) for provider_id, total, down in rows}


def availability(total_seconds, down_seconds) -> Decimal | None:
    """1 − down / total, clipped to [0, 1], four places half to even; None without a total."""
    total, down = Decimal(total_seconds or 0), Decimal(down_seconds or 0)
    if total <= 0:
        return None
    value = min(max(1 - down / total, Decimal(0)), Decimal(1))
    return value.quantize(PLACES, rounding=ROUND_HALF_EVEN)


def recent_provider_reliability() -> dict[int, Decimal | None]:
    """`provider_reliability` now, kept in the cache for a minute (the offers endpoint reads
    it on every request; one measure over every node costs ~100 ms on 12,500 nodes)."""
    return remembered(CACHE_KEY, CACHE_S, provider_reliability)

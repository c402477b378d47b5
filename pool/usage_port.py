"""How the pool reads quota usage and queued orders without importing the market.

The import arrows go market → pool, so the pool cannot read leases or orders. The market app
registers a source here when Django starts (`market/apps.py`); the quota view calls it. The
source answers plain data for one pool: `usage` as `[(queue, model, gpus)]` of the leases
holding its GPUs, and `waiting` as `{queue: [{"order", "gpus", "priority", "position",
"reason"}]}` of its queued orders.
"""

from __future__ import annotations

from collections.abc import Callable

UsageSource = Callable[[object], dict]
_source: UsageSource | None = None


def register_usage_source(source: UsageSource) -> None:
    global _source
    _source = source


def usage_and_waiting(pool) -> dict:
    if _source is None:
        raise RuntimeError("no usage source registered: is the market app installed?")
    return _source(pool)

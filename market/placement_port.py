"""How the market asks for a placement without importing the scheduler.

The import arrows go scheduler → market, so the market cannot import the placement engine.
The scheduler app registers its engine here when Django starts (`scheduler/apps.py`); the
market calls it with the same plain JSON shapes as `python -m scheduler.placement gang`.
"""

from __future__ import annotations

from collections.abc import Callable

GangPlacer = Callable[[dict], dict]
_placer: GangPlacer | None = None


def register_gang_placer(placer: GangPlacer) -> None:
    global _placer
    _placer = placer


def place_gang(document: dict) -> dict:
    """{"levels", "nodes", "request", "profile"} → {"placed", "assignment" | "reason", ...}."""
    if _placer is None:
        raise RuntimeError("no placement engine registered: is the scheduler app installed?")
    return _placer(document)

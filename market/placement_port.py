"""How the market asks for placements without importing the scheduler.

The import arrows go scheduler → market, so the market cannot import the placement engine.
The scheduler app registers its `market.core.clearing.MakePlacer` here when Django starts
(`scheduler/apps.py`); matching and clearing call it through `make_placer()`.
"""

from __future__ import annotations

from market.core.clearing import MakePlacer

_make_placer: MakePlacer | None = None


def register_make_placer(factory: MakePlacer) -> None:
    global _make_placer
    _make_placer = factory


def make_placer() -> MakePlacer:
    if _make_placer is None:
        raise RuntimeError("no placement engine registered: is the scheduler app installed?")
    return _make_placer

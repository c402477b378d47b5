"""How the market asks for placements without importing the scheduler.

The import arrows go scheduler → market, so the market cannot import the placement engine.
The scheduler app registers its `market.core.clearing.MakePlacer` here when Django starts
(`scheduler/apps.py`); matching and clearing call it through `make_placer()`.
"""

from __future__ import annotations

from market.core.clearing import MakePlacer
from market.core.parts import PartPlacer

_make_placer: MakePlacer | None = None
_part_placer: PartPlacer | None = None


def register_make_placer(factory: MakePlacer) -> None:
    global _make_placer
    _make_placer = factory


def make_placer() -> MakePlacer:
    if _make_placer is None:
        raise RuntimeError("no placement engine registered: is the scheduler app installed?")
    return _make_placer


def register_part_placer(placer: PartPlacer) -> None:
    """Parts of GPUs (MIG slices, shares) are placed by `scheduler.core.placement.parts`."""
    global _part_placer
    _part_placer = placer


def part_placer() -> PartPlacer:
    if _part_placer is None:
        raise RuntimeError("no part placer registered: is the scheduler app installed?")
    return _part_placer

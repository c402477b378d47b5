"""The placement index: the capacity tree (`tree.py`) that answers placement requests.

The tree keeps free capacity and the gang placer (`gang.py`) reads it; this class joins them
so that callers hold one object: build it once, then place, commit and release.
"""

from __future__ import annotations

from scheduler.core.placement.gang import place_on_index
from scheduler.core.placement.model import Placement, Request
from scheduler.core.placement.tree import CapacityTree


class PlacementIndex(CapacityTree):
    """Levels plus nodes, indexed once; place many requests, commit or release allocations.

    Not thread-safe: `place` with per-node filters withholds GPUs for its own duration, so
    give each worker its own index.
    """

    def place(self, request: Request, profile: str = "best_fit") -> Placement:
        """Where `request` would go now; changes nothing (see `commit`)."""
        return place_on_index(self, request, profile)

"""IBEX topology-aware placement engine (pure Python, no Django).

Plain-data API used by the scheduler, the market clearing and the trace simulator:

- `Node`, `Request`, `Slice`, `Placement`: frozen dataclasses (see `model.py`).
- `PlacementIndex(levels, nodes)`: build once; `place(request, profile="best_fit")` answers
  without changing anything; `commit(assignment)` / `release(assignment)` take and give back
  GPUs, updating free capacity per domain incrementally.
- `place_gang(levels, nodes, request, profile="best_fit") -> Placement`: one-shot convenience.
- `place_mig(model, occupied, request) -> MigPlacement`: MIG instances on one GPU.
- `choose_shared_gpu(gpus, request, mix=DEFAULT_MIX) -> str | None`: the GPU for a fractional
  request, chosen to keep the pool least fragmented.
- `InvalidInput`: malformed input; `.field` names the offending field.

Profiles: `best_fit` (default), `least_free`, `spread`. See docs in `gang.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.placement.gang import PROFILES, place_on_index
from scheduler.placement.index import PlacementIndex
from scheduler.placement.mig import MIG_MODELS, MigInstance, MigPlacement, MigProfile, place_mig
from scheduler.placement.model import InvalidInput, Node, Placement, Request, Slice
from scheduler.placement.shared import (
    DEFAULT_MIX,
    MixItem,
    SharedGpu,
    SharedRequest,
    choose_shared_gpu,
    fragmentation,
)


def place_gang(
    levels: Sequence[str], nodes: Iterable[Node], request: Request, profile: str = "best_fit"
) -> Placement:
    """Place one gang request on a fresh snapshot; nothing is committed."""
    return place_on_index(PlacementIndex(levels, nodes), request, profile)


__all__ = [
    "DEFAULT_MIX",
    "MIG_MODELS",
    "PROFILES",
    "InvalidInput",
    "MigInstance",
    "MigPlacement",
    "MigProfile",
    "MixItem",
    "Node",
    "Placement",
    "PlacementIndex",
    "Request",
    "SharedGpu",
    "SharedRequest",
    "Slice",
    "choose_shared_gpu",
    "fragmentation",
    "place_gang",
    "place_mig",
]

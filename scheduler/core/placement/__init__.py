"""IBEX topology-aware placement engine: pure Python, no Django, deterministic.

Plain-data API for the scheduler, the market clearing and the trace simulator (the what-if
command is `python -m scheduler.placement`):

    Node(name, labels, free_gpus, gpu_model="", state="up", healthy=True,
         free_cpu_milli=None, free_memory_mib=None, total_gpus=None)
    Slice(size, level)
    Request(gpus, required=None, preferred=None, slice=None, gpu_models=None,
            exclude_nodes=frozenset(), min_cpu_milli_per_gpu=0, min_memory_mib_per_gpu=0)
    Placement(placed, assignment, domains, max_hops, reason, excluded); .to_json()

    PlacementIndex(levels, nodes)           build once (12,500 nodes: ~60 ms)
        .place(request, profile="best_fit") -> Placement   changes nothing
        .commit(assignment) / .release(assignment)          {node name: GPUs}, all or nothing
        .free_gpus(node_name) -> int, .current_nodes() -> list[Node]
    place_gang(levels, nodes, request, profile="best_fit") -> Placement   one-shot

    place_mig(model, occupied: [MigInstance], request: [name | {"memory_mib": n}])
        -> MigPlacement(placed, instances, reason)
    choose_shared_gpu(gpus: [SharedGpu], request: SharedRequest, mix=DEFAULT_MIX) -> id | None

    InvalidInput(field, message)            malformed input; `.field` names it

Conventions worth knowing:
- `levels` run from the widest to the node level; a node's `labels` name its domain at every
  level but the last. Ties between domains are broken by path (names from the top, as
  strings), never by input order.
- Profiles: `best_fit` (default; the narrowest allowed scope, from the node level up when
  the request names no level, chosen and filled compactly: rules 1-5 in `gang.py`),
  `least_free` (same scope as the plain tightest fit, then packs the nodes with the least
  free GPUs inside it, ignoring intermediate levels), `spread`
  (one group of `slice.size` GPUs, default 1, per distinct domain of `slice.level`, default
  the node level; tightest domains first).
- Compact (`best_fit`): a *whole* domain has all its GPUs free, a *broken* one has not.
  Above the leaf level (the level just above the nodes) the scope is the domain that holds
  the request on the fewest leaves, then breaking the fewest whole leaves, then the tightest,
  and it is filled on such leaves (the roomiest whole, the rest to the tightest leaf that
  holds it); at the leaf level a broken leaf comes before a whole one, then the tightest;
  a request one node holds descends into broken, then tightest, domains to the tightest
  node, so whole leaves stay whole (HiveD's buddy cells).
- Slices: capacity counts whole slices; among equally many slices the domain with fewer free
  GPUs is the tighter fit. Slices above the leaf level are filled from the scope down by
  rule 4 (most free slices first, the remainder to the tightest fit).
- `max_hops`: 2 per level climbed from the nodes to their lowest common domain: 0 same
  node, 2 same leaf, 4 same spine group, 6 across the top of a 3-level tree.
- A refusal reads `only X of N GPUs fit[ within one L]` (or `slices`), followed by
  `; excluded: gpu model: 120, unhealthy: 3` when filters excluded nodes; `excluded` holds
  the same counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from market.core.whatif import InvalidInput
from scheduler.core.placement.gang import PROFILES, place_on_index
from scheduler.core.placement.index import PlacementIndex
from scheduler.core.placement.mig import (
    MIG_MODELS,
    MigInstance,
    MigPlacement,
    MigProfile,
    place_mig,
)
from scheduler.core.placement.model import Node, Placement, Request, Slice
from scheduler.core.placement.shared import (
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

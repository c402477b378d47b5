"""The locality vocabulary every app speaks: levels, node keys, and how far apart GPUs are.

A node sits in a leaf, the leaf under a spine, the spine in a fabric. `LEVELS` names them
narrowest first, as the fabric reads them; the placement engine wants them widest first, and an
order may only constrain the levels inside one fabric (fabrics are not cabled to each other, so
no lease spans two). Each of those orders is derived here from `LEVELS`, never spelled again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

LEVELS = ("node", "leaf", "spine", "fabric")
LEVEL_RANK = {level: rank for rank, level in enumerate(LEVELS)}
WIDEST_FIRST = tuple(reversed(LEVELS))
# What an order may require or prefer (`topology.required`/`preferred`): the levels inside one
# fabric, narrowest first. The API's choices.
CONSTRAINT_LEVELS = LEVELS[:-1]
# The engine's levels for a single fabric (the simulator's cluster, the benchmarks): its tree
# starts at the spines.
ONE_FABRIC_WIDEST_FIRST = WIDEST_FIRST[1:]


class NodeKey(NamedTuple):
    """Where a node sits. Spine and leaf names are unique only inside their fabric."""

    fabric: str
    spine: str
    leaf: str
    host: str

    @property
    def labels(self) -> dict[str, str]:
        """The node's domains as the placement engine names them (level → domain), each
        named with its fabric so that two fabrics' `leaf1` stay two leaves."""
        return {"fabric": self.fabric, "spine": f"{self.fabric}/{self.spine}",
                "leaf": f"{self.fabric}/{self.leaf}"}

    @property
    def path(self) -> tuple:
        """Its domains inside its fabric, widest first, down to the node, for `max_hops`. The
        spine carries the fabric's name: two fabrics are as far apart as two spines, the
        farthest a lease is ever sold as."""
        return ((self.fabric, self.spine), self.leaf, self.host)


def max_hops(paths: Sequence[Sequence[str]]) -> int:
    """Worst switch-hop distance between two nodes of a tree, each given by its path of
    domains widest first down to the node: 2 per level climbed from the nodes to their lowest
    common domain (0 same node, 2 same leaf, ..., 2 x levels across the top). The worst pair
    meets at the common prefix of all the paths, which is that of the first and last in order."""
    if not paths:
        return 0
    first, last = min(paths), max(paths)
    common = 0
    while common < len(first) and first[common] == last[common]:
        common += 1
    return 2 * (len(first) - common)


@dataclass(frozen=True)
class Locality:
    """How spread out a set of GPUs is: leaves and spines spanned, and the worst hop count
    between two of them. The terms a lease is sold, shown and measured in."""

    leaves: int = 0
    spines: int = 0
    max_hops: int = 0

    @classmethod
    def of(cls, keys: Iterable[NodeKey]) -> Locality:
        """The locality of GPUs on these nodes (one key per GPU, or per node: same answer)."""
        keys = [NodeKey(*key) for key in keys]
        return cls(leaves=len({(k.fabric, k.leaf) for k in keys}),
                   spines=len({(k.fabric, k.spine) for k in keys}),
                   max_hops=max_hops([k.path for k in keys]))

    def to_json(self) -> dict:
        """As a lease stores it and the API and SLA show it; `{}` for no GPUs."""
        if not self.leaves:
            return {}
        return {"leaves": self.leaves, "spines": self.spines, "max_hops": self.max_hops}

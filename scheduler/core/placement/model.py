"""Plain data shared by the placement engine: nodes, requests, results.

Malformed input raises `InvalidInput`, the one input error of the what-if commands
(`market.core.whatif`), so the command reports the engine's errors as its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from market.core.whatif import InvalidInput

NODE_STATES = ("up", "drain", "down")


@dataclass(frozen=True)
class Node:
    """One server as the engine sees it.

    `labels` name the node's domain at every level but the last (the node itself).
    `total_gpus` bounds `release`; it defaults to `free_gpus`.
    """

    name: str
    labels: Mapping[str, str]
    free_gpus: int
    gpu_model: str = ""
    state: str = "up"
    healthy: bool = True
    free_cpu_milli: int | None = None
    free_memory_mib: int | None = None
    total_gpus: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidInput("name", "must be a non-empty string")
        if self.free_gpus < 0:
            raise InvalidInput("free_gpus", "must not be negative")
        if self.total_gpus is not None and self.total_gpus < self.free_gpus:
            raise InvalidInput("total_gpus", "must be at least free_gpus")
        if self.state not in NODE_STATES:
            raise InvalidInput("state", f"must be one of {', '.join(NODE_STATES)}")
        for name in ("free_cpu_milli", "free_memory_mib"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise InvalidInput(name, "must not be negative")

    @property
    def capacity_gpus(self) -> int:
        return self.free_gpus if self.total_gpus is None else self.total_gpus


@dataclass(frozen=True)
class Slice:
    """GPUs come in groups of `size`, each group inside one domain of `level`."""

    size: int
    level: str

    def __post_init__(self) -> None:
        if self.size < 1:
            raise InvalidInput("request.slice.size", "must be at least 1")


@dataclass(frozen=True)
class Request:
    """A gang request: `gpus` GPUs, all or nothing.

    `required` / `preferred` name a level; `gpu_models` of None accepts any model.
    `mix`: the demands expected next (`fgd.Demand`), which a single-node request is placed
    against (FGD); empty: the tightest node (plain best fit).
    """

    gpus: int
    required: str | None = None
    preferred: str | None = None
    slice: Slice | None = None
    gpu_models: frozenset[str] | None = None
    exclude_nodes: frozenset[str] = frozenset()
    min_cpu_milli_per_gpu: int = 0
    min_memory_mib_per_gpu: int = 0
    # the expected mix of requests (`fgd.Demand`s): a request one node holds goes where the
    # pool's fragmentation against it grows least (FGD); empty: the tightest node
    mix: tuple = ()

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise InvalidInput("request.gpus", "must be at least 1")
        if self.slice is not None and self.gpus % self.slice.size:
            raise InvalidInput("request.slice.size", "must divide request.gpus")
        if self.min_cpu_milli_per_gpu < 0:
            raise InvalidInput("request.min_cpu_milli_per_gpu", "must not be negative")
        if self.min_memory_mib_per_gpu < 0:
            raise InvalidInput("request.min_memory_mib_per_gpu", "must not be negative")
        if self.gpu_models is not None and not isinstance(self.gpu_models, frozenset):
            object.__setattr__(self, "gpu_models", frozenset(self.gpu_models))
        if not isinstance(self.mix, tuple):
            object.__setattr__(self, "mix", tuple(self.mix))
        if not isinstance(self.exclude_nodes, frozenset):
            object.__setattr__(self, "exclude_nodes", frozenset(self.exclude_nodes))

    @property
    def slice_size(self) -> int:
        return 1 if self.slice is None else self.slice.size

    @property
    def units(self) -> int:
        """What must fit: GPUs, or whole slices when the request is sliced."""
        return self.gpus // self.slice_size

    @property
    def unit_name(self) -> str:
        return "GPUs" if self.slice is None else "slices"


@dataclass(frozen=True)
class Placement:
    """The answer to one request, readable by the tenant.

    `assignment` maps node name to GPUs taken, in path order. `domains` lists, per level, the
    names of the domains the placement used. `max_hops` is the worst switch-hop distance
    between two chosen nodes (0 same node, 2 per level climbed: 2 same leaf, 4 same spine
    group, 6 across the top of a 3-level tree). `excluded` counts nodes removed by each filter.
    """

    placed: bool
    assignment: Mapping[str, int] = field(default_factory=dict)
    domains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    max_hops: int | None = None
    reason: str = ""
    excluded: Mapping[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        if self.placed:
            out: dict = {
                "placed": True,
                "assignment": dict(self.assignment),
                "domains": {level: list(names) for level, names in self.domains.items()},
                "max_hops": self.max_hops,
            }
        else:
            out = {"placed": False, "reason": self.reason}
        if self.excluded:
            out["excluded"] = dict(self.excluded)
        return out

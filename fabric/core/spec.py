"""Plain data description of a fabric, shared by parsers, generators, levels and exporters.

Every element may keep the line of the source file it came from (``line``); lines are not
part of equality, so a re-imported fabric compares equal to the original.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from fabric.core.hostlist import natural_sorted

TIERS = ("leaf", "spine", "core", "router")

# What an imported file may hold, so that every spec a parser returns fits the database:
# names as long as Linux allows a host name (a spine domain "first..last" of two of them still
# fits the 200-character columns), descriptions as long as their column, 8-bit port numbers.
MAX_NAME_LENGTH = 64
MAX_DESCRIPTION_LENGTH = 200
MAX_PORTS = 255
KINDS = ("fat-tree", "rail-optimised", "dragonfly", "torus")

Coords = tuple[int, int, int]


def synthetic_guid(kind: str, name: str) -> str:
    """A stable GUID for sources that have none (Slurm files, generators).

    Derived from the name only, so re-importing the same file yields the same GUIDs and the
    database can update rows in place.
    """
    digest = hashlib.blake2b(f"{kind}:{name}".encode(), digest_size=8).hexdigest()
    return f"0x{digest}"


def normalise_guid(text: str) -> str:
    """``0x7CFE90...`` or ``7cfe90...`` -> ``0x7cfe90...`` padded to 16 hex digits."""
    digits = text.lower().removeprefix("0x")
    int(digits, 16)  # raises ValueError on garbage
    return "0x" + digits.rjust(16, "0")


@dataclass(frozen=True)
class SwitchSpec:
    guid: str
    name: str
    tier: str | None  # "leaf" | "spine" | "core" | "router" | None when the source does not say
    ports: int
    group: str | None = None  # dragonfly group name
    coords: Coords | None = None  # torus router position
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class HcaSpec:
    """One cabled HCA port of a host (a rail-optimised host has several)."""

    guid: str
    host: str
    port: int
    description: str
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LinkSpec:
    """A cable between two (GUID, port) ends; ``a`` is the lower end (HCA or lower tier)."""

    a_guid: str
    a_port: int
    b_guid: str
    b_port: int
    rate_gbps: float | None  # None where the source gives no speed
    width: str | None = None  # "1x" .. "12x"
    state: str = "Active"
    line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class FabricSpec:
    kind: str  # one of KINDS
    switches: tuple[SwitchSpec, ...]
    hcas: tuple[HcaSpec, ...]
    links: tuple[LinkSpec, ...]
    gpus_per_node: int | Mapping[str, int] = 8
    torus_dims: Coords | None = None
    sub_box: Coords = (4, 4, 4)  # torus "spine" domain: an aligned box of routers
    source: str | None = field(default=None, compare=False)  # path the spec was read from

    def gpus_of(self, host: str) -> int:
        if isinstance(self.gpus_per_node, Mapping):
            return self.gpus_per_node.get(host, 0)
        return self.gpus_per_node

    @property
    def hosts(self) -> list[str]:
        """Host names, naturally sorted (node2 before node10)."""
        return natural_sorted({hca.host for hca in self.hcas})

    def switch_by_guid(self) -> dict[str, SwitchSpec]:
        return {switch.guid: switch for switch in self.switches}

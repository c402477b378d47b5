"""Parts of GPUs as the market trades them: MIG slices and shares, their prices, and the
plain data the part placer takes and gives (the placer is the scheduler's,
`scheduler.core.placement.parts`, reached through `market.placement_port`).

Prices: a provider prices a GPU per GPU-hour and may price MIG profiles per slice-hour; a
profile it did not price costs the GPU's price times the slice's share of compute slices
(`Ng` of 7), and a share of `s` thousandths costs `s`/1000 of the GPU's price (pro rata),
both rounded by IBEX's one rule (half to even).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from billing.core.money import divide_rounded
from market.core.whatif import InvalidInput

COMPUTE_SLICES = 7  # a MIG-capable GPU's compute, in slices
MEMORY_POSITIONS = 8  # ... and its memory, in the positions a slice starts at

WHOLE = 1000
POSITION_SPAN = WHOLE // MEMORY_POSITIONS  # thousandths of a GPU per memory-slice position

Span = tuple[int, int]  # [lower, upper) thousandths


@dataclass(frozen=True)
class PartGpu:
    """One shareable GPU with no whole-GPU lease, and the parts it holds over the range asked.

    `slices` are the live MIG slices as (profile name, start); `shares` the spans of live
    shares. `part_prices` is what one part costs per hour here (micro-dollars), by part name
    (a MIG profile, or `share`, priced for the request's size); a part not priced is not sold.
    """

    id: int
    node: str
    index: int
    model: str
    memory_mib: int
    slices: tuple[tuple[str, int], ...] = ()
    shares: tuple[Span, ...] = ()
    part_prices: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PartRequest:
    """`count` parts: slices of `mig_profile`, or shares of `share` thousandths."""

    count: int
    mig_profile: str = ""
    share: int | None = None
    max_price_micros: int | None = None  # per part-hour; None: any price

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InvalidInput("count", "must be at least 1")
        if bool(self.mig_profile) == (self.share is not None):
            raise InvalidInput("mig_profile", "give a MIG profile or a share, not both")
        if self.share is not None and not 1 <= self.share < WHOLE:
            raise InvalidInput("gpu_share", "must be between 1 and 999 thousandths")

    @property
    def part_name(self) -> str:
        return self.mig_profile or "share"


@dataclass(frozen=True)
class PlacedPart:
    gpu_id: int
    index: int
    span: Span
    price_micros: int
    mig_profile: str = ""
    start: int | None = None  # MIG: the memory-slice position
    memory_mib: int = 0  # a share's memory limit; a slice's memory

    def agent_json(self) -> dict:
        """What the node agent needs to enforce it (docs/workloads.md, "Parts of GPUs")."""
        if self.mig_profile:
            return {"index": self.index, "mig_profile": self.mig_profile, "start": self.start}
        return {"index": self.index, "share": self.span[1] - self.span[0],
                "memory_mib": self.memory_mib}


@dataclass(frozen=True)
class PartsPlacement:
    placed: bool
    node: str = ""
    model: str = ""
    parts: tuple[PlacedPart, ...] = ()
    reason: str = ""


def share_memory_mib(memory_mib: int, share: int) -> int:
    """A share's memory: the same thousandths of the card's memory, rounded down."""
    return memory_mib * share // WHOLE


def compute_slices(mig_profile: str) -> int:
    """The `N` of an `Ng.Mgb` profile: its sevenths of the GPU's compute."""
    return int(mig_profile.split("g.", 1)[0])


def slice_price_micros(gpu_price_micros: int, mig_profile: str,
                       slice_prices: Mapping[str, int]) -> int:
    """What one slice of `mig_profile` costs per hour: the provider's own price for it, else
    the GPU's price by its share of compute slices."""
    if mig_profile in slice_prices:
        return int(slice_prices[mig_profile])
    return divide_rounded(gpu_price_micros * compute_slices(mig_profile), COMPUTE_SLICES)


def share_price_micros(gpu_price_micros: int, share: int) -> int:
    """What one share of `share` thousandths costs per hour: pro rata."""
    return divide_rounded(gpu_price_micros * share, WHOLE)


def gpu_fraction(mig_profile: str, share: int | None) -> tuple[int, int]:
    """The part's fraction of a GPU as (numerator, denominator): (1, 1) for a whole GPU."""
    if mig_profile:
        return compute_slices(mig_profile), COMPUTE_SLICES
    if share is not None:
        return share, WHOLE
    return 1, 1


class MixItem(NamedTuple):
    """One kind of request the market expects, with its share of recent orders (the fields
    `scheduler.core.placement.shared.MixItem` has, which FGD's measure reads, and `gpus`)."""

    gpu_milli: int  # 1000: whole GPUs
    memory_mib: int
    weight: float
    gpus: int = 1  # whole GPUs asked (a share: 1)


def mix_of(counts: Mapping[tuple[int, int], int]) -> tuple[MixItem, ...]:
    """(GPUs, thousandths of each) asked → orders: the mix, weighted by count. A share's
    memory is its thousandths of the card's, so compute alone decides whether it fits."""
    total = sum(counts.values())
    return tuple(MixItem(milli, 0, count / total, gpus)
                 for (gpus, milli), count in sorted(counts.items()) if count > 0)


class PartPlacer(Protocol):
    def __call__(self, gpus: list[PartGpu], request: PartRequest,
                 mix: Sequence[MixItem] = ...) -> PartsPlacement: ...

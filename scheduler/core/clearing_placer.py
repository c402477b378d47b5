"""The placement engine as the market clearing's placer.

`market.core.clearing` takes its placer as a parameter because market must not import scheduler;
this adapter plugs the engine's `PlacementIndex` in:

    clear_auction(levels, offers, bids, IndexPlacer)
    match_on_demand(levels, offers, orders, IndexPlacer)

or `clear_auction_on_index(...)` / `match_on_demand_on_index(...)` for short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from market.core.clearing import (
    AuctionClearing,
    Bid,
    NodeOffer,
    OnDemandResult,
    clear_auction,
    match_on_demand,
)
from scheduler.core.placement import Node, PlacementIndex, Request, Slice
from scheduler.core.placement.fgd import Demand


def request_for(bid: Bid, levels: Sequence[str], mix: tuple[Demand, ...] = ()) -> Request:
    """The engine's request for a whole bid: its GPUs, models and topology constraint, placed
    against `mix` (FGD) where one node holds it."""
    topology = bid.topology
    slice_ = None
    if topology.slice_size is not None:
        slice_ = Slice(size=topology.slice_size, level=topology.slice_level or levels[-1])
    return Request(
        gpus=bid.gpus,
        required=topology.required,
        preferred=topology.preferred,
        slice=slice_,
        gpu_models=bid.gpu_models or None,
        mix=mix,
    )


def node_for(offer: NodeOffer) -> Node:
    return Node(name=offer.name, labels=offer.labels, free_gpus=offer.free_gpus,
                gpu_model=offer.gpu_model, total_gpus=offer.free_gpus)


class IndexPlacer:
    """A `market.core.clearing.Placer` over one `PlacementIndex` (best-fit by default)."""

    def __init__(self, levels: Sequence[str], offers: Sequence[NodeOffer],
                 profile: str = "best_fit", mix: Sequence = ()) -> None:
        """`mix`: the requests expected next, as `market.core.parts.MixItem`s (gpus,
        gpu_milli, weight): single-node bids go where fragmentation grows least."""
        self.levels = tuple(levels)
        self.index = PlacementIndex(self.levels, [node_for(offer) for offer in offers])
        self.profile = profile
        self.mix = demands_of(mix)

    def place(self, bid: Bid) -> tuple[Mapping[str, int] | None, str]:
        placement = self.index.place(request_for(bid, self.levels, self.mix), self.profile)
        if not placement.placed:
            return None, placement.reason
        return placement.assignment, ""

    def commit(self, assignment: Mapping[str, int]) -> None:
        self.index.commit(assignment)

    def release(self, assignment: Mapping[str, int]) -> None:
        self.index.release(assignment)


def demands_of(mix: Sequence) -> tuple[Demand, ...]:
    """The market's mix (plain items with gpus, gpu_milli, weight) as the engine's demands."""
    return tuple(Demand(gpus=item.gpus, gpu_milli=item.gpu_milli if item.gpus == 1 else 1000,
                        weight=item.weight) for item in mix)


def clear_auction_on_index(
    levels: Sequence[str], offers: Sequence[NodeOffer], bids: Sequence[Bid], exact: bool = True
) -> AuctionClearing:
    return clear_auction(levels, offers, bids, IndexPlacer, exact=exact)


def match_on_demand_on_index(
    levels: Sequence[str], offers: Sequence[NodeOffer], orders: Sequence[Bid]
) -> OnDemandResult:
    return match_on_demand(levels, offers, orders, IndexPlacer)

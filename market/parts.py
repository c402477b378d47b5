"""Selling parts of GPUs (MIG slices and shares): which GPUs can sell one now, at what price,
and where the part placer puts an order's parts (market.core.parts says how they are priced,
`scheduler.core.placement.parts` how they are placed).

A GPU sells parts when its provider marked it `shareable`; it sells MIG slices when its model
is MIG-capable with that profile. A GPU held whole by a lease sells no part, and a GPU with
any part is not sold whole (the whole-GPU markets see only GPUs with no allocation at all).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from billing.core.money import divide_rounded
from fabric.core.locality import Locality, NodeKey
from ibex.caching import remembered
from market import leasing
from market.core.parts import (
    POSITION_SPAN,
    WHOLE,
    MixItem,
    PartGpu,
    PartRequest,
    PlacedPart,
    mix_of,
    share_memory_mib,
    share_price_micros,
    slice_price_micros,
)
from market.models import Allocation, Order
from market.placement_port import make_placer, part_placer
from pool.models import GpuModel
from pool.services import offered_gpus


def is_parts(order: Order) -> bool:
    return bool(order.mig_profile) or order.gpu_share is not None


def part_request(order: Order, limit_micros: int | None = None) -> PartRequest:
    """The order's parts, within its limit (or `limit_micros`, a moved lease's price)."""
    return PartRequest(count=order.gpus, mig_profile=order.mig_profile, share=order.gpu_share,
                       max_price_micros=order.max_price_micros if limit_micros is None
                       else limit_micros)


def models_selling(mig_profile: str, gpu_models: list[str]) -> list[str]:
    """Of `gpu_models`, those whose MIG profiles include `mig_profile`."""
    return sorted(name for name, profiles in GpuModel.objects.filter(
        name__in=gpu_models, mig_capable=True).values_list("name", "mig_profiles")
        if mig_profile in profiles)


@dataclass(frozen=True)
class FoundParts:
    """Where the part placer put an order: one node's parts, as `FoundGpus` reads."""

    key: NodeKey
    gpu_model: str
    parts: tuple[PlacedPart, ...]

    def choices(self) -> list[leasing.GpuChoice]:
        return [leasing.GpuChoice(p.gpu_id, p.price_micros, part=part_of(p))
                for p in self.parts]

    def locality(self) -> dict:
        return Locality.of([self.key]).to_json()

    def price_micros(self, limit_micros: int) -> int:
        prices = [p.price_micros for p in self.parts]
        return min(divide_rounded(sum(prices), len(prices)), limit_micros)


def part_of(placed: PlacedPart) -> leasing.Part:
    kind = "mig" if placed.mig_profile else "share"
    return leasing.Part(kind=kind, span=placed.span, mig_profile=placed.mig_profile)


MIX_WINDOW = timedelta(days=7)
MIX_ORDERS = 2000
MIX_CACHE_S = 60
MIX_MIN_ORDERS = 20
MIX_KEY = "ibex:parts-mix"


def recent_mix(pool_id: int | None = None) -> tuple[MixItem, ...]:
    """The mix of requests the market expects, learnt from its latest orders of the past week
    (whole GPUs by how many an order asks, shares by their size; slices are placed by
    position, not by a mix): what a placement's fragmentation is measured against (FGD).
    Empty while there are too few orders to learn from (plain best fit then). `pool_id`: a
    private pool's orders instead of the public market's."""
    key = MIX_KEY if pool_id is None else f"{MIX_KEY}:{pool_id}"
    return remembered(key, MIX_CACHE_S, lambda: _mix_of_orders(pool_id))


def _mix_of_orders(pool_id: int | None) -> tuple[MixItem, ...]:
    rows = list(Order.objects.filter(created_at__gte=timezone.now() - MIX_WINDOW,
                                     pool_id=pool_id, mig_profile="")
                .order_by("-created_at").values_list("gpus", "gpu_share")[:MIX_ORDERS])
    counts = Counter((1, share) if share else (gpus, WHOLE) for gpus, share in rows)
    return mix_of(counts) if len(rows) >= MIX_MIN_ORDERS else ()


def placer_with_mix():
    """The placement engine's placer factory, placing against the market's recent mix."""
    mix = recent_mix()
    return partial(make_placer(), mix=mix) if mix else make_placer()


def part_gpus(order: Order, start: datetime, end: datetime, runtimes: frozenset[str] | None,
              avoid_nodes: frozenset[int] = frozenset()) -> tuple[list[PartGpu], dict]:
    """The shareable GPUs that could sell the order's parts over [start, end), each with the
    parts it holds then and the price of the order's part on it; and hostname → NodeKey."""
    models = (models_selling(order.mig_profile, order.gpu_models) if order.mig_profile
              else order.gpu_models)
    window = (Q(prices__offered_from__isnull=True) | Q(prices__offered_from__lte=start)) & (
        Q(prices__offered_until__isnull=True) | Q(prices__offered_until__gte=end))
    on_nodes = Q() if runtimes is None else Q(node__runtime__in=sorted(runtimes))
    rows = list(
        offered_gpus().exclude(node__pools__kind="private").filter(shareable=True)
        .filter(on_nodes)
        .filter(Q(gpu_model__name__in=models, prices__superseded_at__isnull=True,
                  prices__min_lease_hours__lte=order.hours) & window)
        .exclude(Exists(Allocation.objects.filter(gpu=OuterRef("pk"), part="whole",
                                                  period__overlap=(start, end))))
        .exclude(node_id__in=sorted(avoid_nodes))
        .values_list("id", "index", "memory_mib", "gpu_model__name", "node__hostname",
                     "node__fabric__name", "node__host__spine", "node__host__leaf",
                     "prices__price_micros", "prices__slice_prices"))
    held: dict[int, list[tuple[str, str, object]]] = defaultdict(list)
    for gpu_id, part, profile, span in Allocation.objects.filter(
            gpu_id__in=[r[0] for r in rows], period__overlap=(start, end)).values_list(
            "gpu_id", "part", "mig_profile", "span"):
        held[gpu_id].append((part, profile, span))
    gpus, keys = [], {}
    for (gpu_id, index, memory, model, host, fabric, spine, leaf, price,
         slice_prices) in rows:
        keys[host] = NodeKey(fabric, spine, leaf, host)
        if order.mig_profile:
            part_price = slice_price_micros(price, order.mig_profile, slice_prices or {})
        else:
            part_price = share_price_micros(price, order.gpu_share)
        gpus.append(PartGpu(
            id=gpu_id, node=host, index=index, model=model, memory_mib=memory,
            slices=tuple((profile, span.lower // POSITION_SPAN) for part, profile, span in held[gpu_id]
                         if part == "mig"),
            shares=tuple((span.lower, span.upper) for part, _, span in held[gpu_id]
                         if part == "share"),
            part_prices={order.mig_profile or "share": part_price}))
    return gpus, keys


def find_parts(order: Order, start: datetime, end: datetime,
               avoid_nodes: frozenset[int] = frozenset(),
               limit_micros: int | None = None) -> FoundParts | str:
    """Place the order's parts on the GPUs free over [start, end) now (within its price
    limit, or `limit_micros`; on nodes that can run what it asks), or why they fit nowhere."""
    gpus, keys = part_gpus(order, start, end, leasing.runtimes_of(order), avoid_nodes)
    request = part_request(order, limit_micros)
    mix = recent_mix() if request.share is not None else ()
    placed = part_placer()(gpus, request, mix) if mix else part_placer()(gpus, request)
    if not placed.placed:
        return placed.reason
    return FoundParts(key=keys[placed.node], gpu_model=placed.model, parts=placed.parts)


def is_parts_lease(lease) -> bool:
    return bool(lease.mig_profile) or lease.gpu_share is not None


def part_rows(allocations) -> list[tuple[str, int, str, int, int]]:
    """Allocations (with gpu__node) → (hostname, GPU index, MIG profile, span lower, upper),
    as `pool.workloads.parts_view` reads them."""
    return [(a.gpu.node.hostname, a.gpu.index, a.mig_profile, a.span.lower, a.span.upper)
            for a in allocations]


def bindings_of(allocations) -> tuple[dict[int, list[int]], dict[int, list[dict]]]:
    """What a lease's nodes are bound to, from its allocations (a queryset): node id → GPU
    indexes, and node id → its parts as the agent enforces them (docs/workloads.md)."""
    indexes: dict[int, list[int]] = defaultdict(list)
    node_parts: dict[int, list[dict]] = defaultdict(list)
    for node_id, index, part, profile, span, memory in allocations.order_by(
            "gpu__index", "span").values_list("gpu__node_id", "gpu__index", "part",
                                              "mig_profile", "span", "gpu__memory_mib"):
        if index not in indexes[node_id]:
            indexes[node_id].append(index)
        if part == "mig":
            node_parts[node_id].append({"index": index, "mig_profile": profile,
                                        "start": span.lower // POSITION_SPAN})
        elif part == "share":
            width = span.upper - span.lower
            node_parts[node_id].append({"index": index, "share": width,
                                        "memory_mib": share_memory_mib(memory, width)})
    return dict(indexes), dict(node_parts)

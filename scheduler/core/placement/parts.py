"""Parts of GPUs: placing MIG slices and shares (thousandths of a GPU) for the market.

A part lease is one node's: `count` slices of one MIG profile, or `count` shares of one size
on distinct GPUs. Every part holds a *span* of its GPU in thousandths, and the database's
exclusion constraint keeps spans of one GPU apart (a whole GPU holds [0, 1000)):

- a MIG slice at memory-slice position `start` of `slices` holds
  [start * 125, (start + slices) * 125): the real positions, so two slices overlap exactly
  when NVIDIA's hardware says they would;
- a share holds any free run of its width. The run is logical (MPS limits the percentage, not
  which SMs), so among the free runs wide enough we take the narrowest: wide runs stay whole.

A GPU carries slices or shares, never both at once (MPS and MIG do not mix on one card), and
a GPU with any part is not sold whole until its last part ends (the whole-GPU markets only see
GPUs with no allocation at all).

Which GPU (`choose_parts`): the cheapest part first (the tenant pays the posted price), then
the choice that grows fragmentation least: for shares FGD's measure against the expected mix
of requests (`shared.fragmentation`), for slices the GPU already broken before a whole one and
the start that keeps the largest free run; then the node with the fewest free positions left
(best fit), then names. Pure: no Django, plain data in and out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from market.core.parts import (
    POSITION_SPAN,
    WHOLE,
    PartGpu,
    PartRequest,
    PartsPlacement,
    PlacedPart,
    Span,
    share_memory_mib,
)
from scheduler.core.placement.mig import (
    MIG_MODELS,
    POSITIONS,
    MigProfile,
    largest_free_run,
)
from scheduler.core.placement.shared import DEFAULT_MIX, MixItem, fragmentation


def mig_profile_of(model: str, name: str) -> MigProfile | None:
    return MIG_MODELS.get(model, {}).get(name)


def mig_span(profile: MigProfile, start: int) -> Span:
    return start * POSITION_SPAN, (start + profile.slices) * POSITION_SPAN


def free_runs(taken: Sequence[Span]) -> list[Span]:
    """The free runs of [0, 1000) between the taken spans."""
    runs, at = [], 0
    for lower, upper in sorted(taken):
        if lower > at:
            runs.append((at, lower))
        at = max(at, upper)
    if at < WHOLE:
        runs.append((at, WHOLE))
    return runs


def choose_parts(gpus: Sequence[PartGpu], request: PartRequest,
                 mix: Sequence[MixItem] = DEFAULT_MIX) -> PartsPlacement:
    """Place all `count` parts on one node, or say why no node can take them."""
    by_node: dict[str, list[PartGpu]] = {}
    for gpu in sorted(gpus, key=lambda g: (g.node, g.index)):
        by_node.setdefault(gpu.node, []).append(gpu)
    best: tuple | None = None
    for node, node_gpus in by_node.items():
        found = (_slices_on_node(node_gpus, request) if request.mig_profile
                 else _shares_on_node(node_gpus, request, tuple(mix)))
        if found is None:
            continue
        parts, score = found
        key = (*score, node)
        if best is None or key < best[0]:
            best = (key, node, parts)
    if best is None:
        return PartsPlacement(placed=False, reason=_why_not(gpus, request))
    _, node, parts = best
    model = next(g.model for g in by_node[node])
    return PartsPlacement(placed=True, node=node, model=model, parts=tuple(parts))


# --- MIG slices ---------------------------------------------------------------------------------


def _slice_mask(gpu: PartGpu) -> int | None:
    """The GPU's occupied positions, or None when it cannot take slices (shares live on it)."""
    if gpu.shares:
        return None
    mask = 0
    for name, start in gpu.slices:
        profile = mig_profile_of(gpu.model, name)
        if profile is None:  # a slice of a profile we do not know: treat the card as full
            return (1 << POSITIONS) - 1
        mask |= ((1 << profile.slices) - 1) << start
    return mask


@lru_cache(maxsize=4096)
def _best_start(mask: int, profile: MigProfile) -> tuple[int, int] | None:
    """(minus the largest free run left, start) of the legal start that leaves the largest
    free run, the lowest on a tie; None when no legal start is free. (Most GPUs share a few
    masks: cached.)"""
    best = None
    for start in profile.starts:
        bits = ((1 << profile.slices) - 1) << start
        if not mask & bits:
            key = (-largest_free_run(mask | bits), start)
            if best is None or key < best:
                best = key
    return best


def _slices_on_node(gpus: list[PartGpu], request: PartRequest) -> tuple[list, tuple] | None:
    """`count` slices on this node's GPUs, one at a time, each to the cheapest GPU, broken
    before whole, at the start leaving the largest free run; None when they do not all fit."""
    masks = {g.id: _slice_mask(g) for g in gpus}
    parts: list[PlacedPart] = []
    cost = broken_whole = 0
    for _ in range(request.count):
        choice = None
        for gpu in gpus:
            profile = mig_profile_of(gpu.model, request.mig_profile)
            price = gpu.part_prices.get(request.mig_profile)
            mask = masks[gpu.id]
            if profile is None or price is None or mask is None or not _affordable(price,
                                                                                    request):
                continue
            best = _best_start(mask, profile)
            if best is None:
                continue
            key = (price, mask == 0, best[0], gpu.index, best[1])
            if choice is None or key < choice[0]:
                choice = (key, gpu, profile, best[1], price)
        if choice is None:
            return None
        _, gpu, profile, start, price = choice
        bits = ((1 << profile.slices) - 1) << start
        broken_whole += masks[gpu.id] == 0
        masks[gpu.id] |= bits
        cost += price
        parts.append(PlacedPart(gpu.id, gpu.index, mig_span(profile, start), price,
                                mig_profile=profile.name, start=start,
                                memory_mib=profile.memory_mib))
    free_positions = sum(POSITIONS - bin(m).count("1") for m in masks.values() if m is not None)
    return parts, (cost, broken_whole, free_positions)


# --- shares -------------------------------------------------------------------------------------


def _shares_on_node(gpus: list[PartGpu], request: PartRequest,
                    mix: tuple[MixItem, ...]) -> tuple[list, tuple] | None:
    """`count` shares on distinct GPUs of this node, each to the GPU whose fragmentation
    against `mix` grows least (cheapest first); None when fewer GPUs can take one."""
    share = request.share or 0
    candidates = []
    for gpu in gpus:
        price = gpu.part_prices.get("share")
        if gpu.slices or price is None or not _affordable(price, request):
            continue
        run = _narrowest_run(gpu.shares, share)
        if run is None:
            continue
        free = WHOLE - sum(upper - lower for lower, upper in gpu.shares)
        growth = _growth(free, gpu.memory_mib, share, mix)
        candidates.append(((price, growth, free - share, gpu.index), gpu, run, price))
    if len(candidates) < request.count:
        return None
    chosen = sorted(candidates, key=lambda c: c[0])[:request.count]
    parts = [PlacedPart(gpu.id, gpu.index, (run[0], run[0] + share), price,
                        memory_mib=share_memory_mib(gpu.memory_mib, share))
             for _, gpu, run, price in sorted(chosen, key=lambda c: c[1].index)]
    cost = sum(c[3] for c in chosen)
    growth = round(sum(c[0][1] for c in chosen), 9)
    whole_broken = sum(1 for _, gpu, _, _ in chosen if not gpu.shares)
    left = sum(c[0][2] for c in chosen)
    return parts, (cost, growth, whole_broken, left)


@lru_cache(maxsize=4096)
def _growth(free: int, memory_mib: int, share: int, mix: tuple[MixItem, ...]) -> float:
    """How much a share of `share` grows a GPU's fragmentation against `mix` (FGD)."""
    memory = memory_mib * free // WHOLE
    return round(fragmentation(free - share, memory - share_memory_mib(memory_mib, share), mix)
                 - fragmentation(free, memory, mix), 9)


@lru_cache(maxsize=4096)
def _narrowest_run(taken: tuple[Span, ...], width: int) -> Span | None:
    runs = [r for r in free_runs(taken) if r[1] - r[0] >= width]
    return min(runs, key=lambda r: (r[1] - r[0], r[0])) if runs else None


def _affordable(price: int, request: PartRequest) -> bool:
    return request.max_price_micros is None or price <= request.max_price_micros


# --- refusals -----------------------------------------------------------------------------------


def _why_not(gpus: Sequence[PartGpu], request: PartRequest) -> str:
    """The reason a tenant reads: what blocked the parts on the GPUs that could sell them."""
    name = request.part_name
    asked = f"{request.count} × {name}" if request.mig_profile else \
        f"{request.count} × share {request.share}/1000"
    sellers = [g for g in gpus if name in g.part_prices
               and (not request.mig_profile or mig_profile_of(g.model, name))]
    if not sellers:
        return f"no shareable GPU of these models sells {name}"
    affordable = [g for g in sellers if _affordable(g.part_prices[name], request)]
    if not affordable:
        cheapest = min(g.part_prices[name] for g in sellers)
        return (f"no {name} within the limit: the cheapest is {cheapest} µ$ per hour "
                f"(limit {request.max_price_micros})")
    if request.mig_profile:
        with_shares = sum(1 for g in affordable if g.shares)
        profile_starts = sorted({s for g in affordable
                                 for s in mig_profile_of(g.model, name).starts})
        why = (f"no legal position for {name} (starts {', '.join(map(str, profile_starts))}) "
               f"is free on {len(affordable)} GPU{'s' if len(affordable) != 1 else ''}")
        if with_shares:
            why += f" ({with_shares} hold shares)"
        if request.count > 1:
            why = f"no node has room for {asked}: " + why
        return why
    roomy = sum(1 for g in affordable if not g.slices
                and _narrowest_run(g.shares, request.share or 0) is not None)
    if roomy:
        return (f"no node has {request.count} GPUs with room for a share of "
                f"{request.share}/1000 (the most on one node: "
                f"{_most_on_one_node(affordable, request)})")
    return f"no GPU has {request.share}/1000 free for {asked}"


def _most_on_one_node(gpus: Sequence[PartGpu], request: PartRequest) -> int:
    per_node: dict[str, int] = {}
    for gpu in gpus:
        if not gpu.slices and _narrowest_run(gpu.shares, request.share or 0) is not None:
            per_node[gpu.node] = per_node.get(gpu.node, 0) + 1
    return max(per_node.values(), default=0)


# --- defragmentation: moving spot parts so that whole GPUs are free again -----------------------


@dataclass(frozen=True)
class HeldPart:
    """One part a lease holds now: on `gpu` (an id of `gpus`), a slice or a share."""

    lease: int
    gpu: int
    span: Span
    mig_profile: str = ""
    movable: bool = False  # a spot lease whose tenant allows moves
    paid_micros: int = 0  # what the lease pays for it per hour: a target never costs more
    runtimes: frozenset[str] | None = None  # the node runtimes that can run it; None: any


@dataclass(frozen=True)
class PartMove:
    """Move the lease's parts on `away_from` onto `onto`: (GPU id, span, MIG start or None)."""

    lease: int
    away_from: int
    onto: tuple[tuple[int, Span, int | None], ...]


def plan_part_moves(gpus: Sequence[PartGpu], held: Sequence[HeldPart],
                    runtime_of: Mapping[str, str] | None = None,
                    max_moves: int = 20) -> list[PartMove]:
    """Moves of movable parts that empty GPUs holding parts, so they are sold whole again.

    The GPUs with the fewest thousandths held are emptied first, each only when every part on
    it can go, onto other GPUs that already hold parts (never onto a whole free GPU: that would
    break one to free one), the fullest first; a lease's parts stay on one node and its shares
    on distinct GPUs; a target's posted price for the part is within what the lease pays.
    `gpus` carry their parts' prices in `part_prices` (a profile, or `share:<width>`).
    """
    runtime_of = runtime_of or {}
    by_id = {g.id: g for g in gpus}
    on_gpu: dict[int, list[HeldPart]] = {g.id: [] for g in gpus}
    for part in held:
        if part.gpu in on_gpu:
            on_gpu[part.gpu].append(part)
    moves: list[PartMove] = []
    emptied: set[int] = set()
    used = {gid: sum(p.span[1] - p.span[0] for p in parts) for gid, parts in on_gpu.items()}
    for source in sorted((gid for gid, parts in on_gpu.items() if parts),
                         key=lambda gid: (used[gid], by_id[gid].node, by_id[gid].index)):
        if len(moves) >= max_moves:
            break
        parts = on_gpu[source]
        if not parts or not all(p.movable for p in parts):
            continue
        planned = _empty_gpu(source, parts, by_id, on_gpu, emptied, runtime_of)
        if planned is None:
            continue
        emptied.add(source)
        for lease, onto in planned.items():
            moves.append(PartMove(lease, source, tuple(onto)))
    return moves[:max_moves]


def _empty_gpu(source: int, parts: list[HeldPart], by_id: Mapping[int, PartGpu],
               on_gpu: dict[int, list[HeldPart]], emptied: set[int],
               runtime_of: Mapping[str, str]) -> dict[int, list] | None:
    """Targets for every part on `source` (applied to `on_gpu` when all fit), or None."""
    added: list[HeldPart] = []
    planned: dict[int, list] = {}
    for part in sorted(parts, key=lambda p: (p.span[0] - p.span[1], p.lease, p.span)):
        target = _target_for(part, source, by_id, on_gpu, emptied, runtime_of)
        if target is None:
            for extra in added:
                on_gpu[extra.gpu].remove(extra)
            return None
        gpu_id, span, start = target
        moved = HeldPart(part.lease, gpu_id, span, part.mig_profile, part.movable,
                         part.paid_micros, part.runtimes)
        on_gpu[gpu_id].append(moved)
        added.append(moved)
        planned.setdefault(part.lease, []).append((gpu_id, span, start))
    on_gpu[source] = []
    return planned


def _target_for(part: HeldPart, source: int, by_id: Mapping[int, PartGpu],
                on_gpu: dict[int, list[HeldPart]], emptied: set[int],
                runtime_of: Mapping[str, str]):
    home = by_id[source]
    others = {p.gpu for parts in on_gpu.values() for p in parts
              if p.lease == part.lease and p.gpu != source}
    nodes = {by_id[g].node for g in others}
    best = None
    for gpu_id, there in on_gpu.items():
        gpu = by_id[gpu_id]
        if gpu_id == source or gpu_id in emptied or not there or gpu.model != home.model:
            continue
        if nodes and gpu.node not in nodes:
            continue  # a lease's parts stay on one node
        if part.runtimes is not None and runtime_of.get(gpu.node, "none") not in part.runtimes:
            continue
        name = part.mig_profile or f"share:{part.span[1] - part.span[0]}"
        price = gpu.part_prices.get(name)
        if price is None or price > part.paid_micros:
            continue
        placed = _room_for(part, gpu, there)
        if placed is None:
            continue
        span, start, free_after = placed
        key = (free_after, gpu.node, gpu.index)
        if best is None or key < best[0]:
            best = (key, (gpu_id, span, start))
    return None if best is None else best[1]


def _room_for(part: HeldPart, gpu: PartGpu, there: list[HeldPart]):
    """(span, MIG start, thousandths free after) of the part on `gpu` beside `there`, or None."""
    slices = [p for p in there if p.mig_profile]
    shares = [p for p in there if not p.mig_profile]
    if part.mig_profile:
        profile = mig_profile_of(gpu.model, part.mig_profile)
        if profile is None or shares:
            return None
        mask = 0
        for p in slices:
            mask |= _span_bits(p.span)
        best = None
        for start in profile.starts:
            bits = ((1 << profile.slices) - 1) << start
            if not mask & bits:
                key = -largest_free_run(mask | bits)
                if best is None or key < best[0]:
                    best = (key, start)
        if best is None:
            return None
        start = best[1]
        free = WHOLE - sum(p.span[1] - p.span[0] for p in there) - profile.slices * POSITION_SPAN
        return mig_span(profile, start), start, free
    if slices or any(p.lease == part.lease for p in shares):
        return None  # no shares beside slices; a lease's shares on distinct GPUs
    width = part.span[1] - part.span[0]
    run = _narrowest_run(tuple(sorted(p.span for p in shares)), width)
    if run is None:
        return None
    free = WHOLE - sum(p.span[1] - p.span[0] for p in shares) - width
    return (run[0], run[0] + width), None, free


def _span_bits(span: Span) -> int:
    lower, upper = span[0] // POSITION_SPAN, span[1] // POSITION_SPAN
    return ((1 << (upper - lower)) - 1) << lower

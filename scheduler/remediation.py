"""Remediation: move active leases off failed GPUs and unreachable nodes.

For each active lease holding a GPU that failed (or sits on an unreachable node), look for as
many free, healthy, offered GPUs of the lease's model, priced within its limit, inside the
domain its topology constraint promised (the leaf or spine its other GPUs share); move the
lease there and tell the nodes through their bindings. With no replacement the lease stays
where it is, `degraded` (an event), and the SLA credits cover the downtime.

One pass builds one index of the free GPUs (`scheduler.replacement.FreeIndex`, one query) and
takes every lease's replacements from it. Leases are handled fifty to a transaction: locked
together (skipping those another worker holds), moved with `market.leasing.move_many` and
rebound with `pool.set_lease_bindings`, a few statements a chunk; if a replacement was taken
meanwhile (the exclusion constraint refuses the chunk), that chunk is redone one lease at a
time with `move_off`, which `scheduler.drain` uses too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from market import leasing
from market.models import Allocation, Lease, LeaseEvent
from pool import services as pool
from pool.models import Gpu, Node
from scheduler.replacement import FreeIndex, Slot, domain_of

CHUNK = 50


@dataclass(frozen=True)
class Held:
    """One GPU a lease holds now, where it sits, and whether it is broken."""

    gpu_id: int
    node_id: int
    index: int
    fabric: str
    spine: str
    leaf: str
    host: str
    broken: bool

    def domain(self, level: str | None):
        return domain_of(level, self.fabric, self.spine, self.leaf, self.host)


def _broken() -> Q:
    """An allocation whose GPU failed or whose node went silent."""
    return Q(gpu__health=Gpu.Health.FAILED) | Q(gpu__node__health=Node.Health.UNREACHABLE)


def held_by(lease_ids: list[int], now: datetime) -> dict[int, list[Held]]:
    """The GPUs each lease holds at `now`, in one query (read it under the leases' locks, with
    the time read after them)."""
    rows = Allocation.objects.filter(lease_id__in=lease_ids, period__contains=now).values_list(
        "lease_id", "gpu_id", "gpu__node_id", "gpu__index", "gpu__node__fabric__name",
        "gpu__node__host__spine", "gpu__node__host__leaf", "gpu__node__hostname", "gpu__health",
        "gpu__node__health")
    held: dict[int, list[Held]] = defaultdict(list)
    for lease, gpu, node, index, fabric, spine, leaf, host, health, node_health in rows:
        held[lease].append(Held(gpu, node, index, fabric, spine, leaf, host,
                                health == Gpu.Health.FAILED
                                or node_health == Node.Health.UNREACHABLE))
    return held


def held_now(lease: Lease, now: datetime) -> list[Held]:
    return held_by([lease.pk], now)[lease.pk]


def broken_gpus_of(lease: Lease, now: datetime) -> list[int]:
    return [h.gpu_id for h in held_now(lease, now) if h.broken]


def lock_active(lease_id: int) -> Lease | None:
    """The active lease under its row lock (with its order), or None when another worker holds
    it or it is no longer active."""
    return (Lease.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("order").filter(pk=lease_id, state=Lease.State.ACTIVE).first())


def remediate_leases(*, now: datetime | None = None) -> dict[int, str]:
    """Lease id → what was done ("moved" or "degraded") for every lease that needed it."""
    now = now or timezone.now()
    outcome: dict[int, str] = {}
    affected = sorted(set(
        Allocation.objects.filter(lease__state=Lease.State.ACTIVE, period__contains=now)
        .filter(_broken()).values_list("lease_id", flat=True).distinct()))
    if not affected:
        return outcome
    index = FreeIndex.build(now)
    for chunk in chunks(affected):
        with transaction.atomic():
            outcome.update(_remediate_chunk(chunk, index))
    return outcome


def chunks(ids: list[int], size: int | None = None) -> list[list[int]]:
    """Leases are remediated `size` to a transaction: locked together (skipping any another
    worker holds) and moved in a few statements, so a pass over a thousand leases is short and
    the locks are held for one chunk's time only."""
    size = size or CHUNK
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def _remediate_chunk(chunk: list[int], index: FreeIndex) -> dict[int, str]:
    leases = list(Lease.objects.select_for_update(skip_locked=True, of=("self",))
                  .select_related("order").filter(pk__in=chunk, state=Lease.State.ACTIVE)
                  .order_by("pk"))
    # read under the locks, as of now: a pass that locked them first may have moved them
    held = held_by([lease.pk for lease in leases], timezone.now())
    outcome, planned, stuck = {}, [], []
    for lease in leases:
        broken = {h.gpu_id for h in held[lease.pk] if h.broken}
        if not broken:
            outcome[lease.pk] = "moved"  # moved by an overlapping pass meanwhile
            continue
        chosen = _choose(lease, held[lease.pk], broken, index)
        if chosen is None:
            stuck.append((lease, broken))
        else:
            planned.append((leasing.PlannedMove(
                lease=lease, away_from=sorted(broken),
                onto=[leasing.GpuChoice(s.gpu_id, s.price_micros) for s in chosen],
                reason="moved off failed GPUs"), held[lease.pk], chosen))
    if planned:
        stuck += _move(planned, index, outcome)
    _degrade(stuck)
    outcome.update({lease.pk: "degraded" for lease, _ in stuck})
    return outcome


def _move(planned: list, index: FreeIndex, outcome: dict[int, str]) -> list:
    """Apply a chunk's moves together; if a target was taken meanwhile (the exclusion
    constraint refused them), read the free GPUs again and move the leases one at a time.
    Returns the leases left without a replacement."""
    stuck = []
    try:
        with transaction.atomic():
            leasing.move_many(moves=[m for m, _, _ in planned])
            pool.set_lease_bindings(wanted={
                m.lease.reference: _bindings_after(h, set(m.away_from), chosen)
                for m, h, chosen in planned})
        outcome.update({m.lease.pk: "moved" for m, _, _ in planned})
    except leasing.GpusUnavailable:
        index.refresh(timezone.now())
        for move, lease_held, _ in planned:
            if move_off(lease=move.lease, held=lease_held, leaving=set(move.away_from),
                        index=index, reason=move.reason):
                outcome[move.lease.pk] = "moved"
            else:
                stuck.append((move.lease, set(move.away_from)))
    return stuck


def _degrade(stuck: list[tuple[Lease, set[int]]]) -> None:
    """One `degraded` event per lease left on broken GPUs (none if it already has one)."""
    if not stuck:
        return
    told = set(LeaseEvent.objects.filter(lease__in=[lease for lease, _ in stuck],
                                         kind="degraded").values_list("lease_id", flat=True))
    LeaseEvent.objects.bulk_create([
        LeaseEvent(lease=lease, kind="degraded", actor="scheduler",
                   reason=f"no replacement for GPUs {sorted(broken)}")
        for lease, broken in stuck if lease.pk not in told])


def _bindings_after(held: list[Held], leaving: set[int], chosen: list[Slot]
                    ) -> dict[int, list[int]]:
    wanted: dict[int, list[int]] = defaultdict(list)
    for h in held:
        if h.gpu_id not in leaving:
            wanted[h.node_id].append(h.index)
    for slot in chosen:
        wanted[slot.node_id].append(slot.index)
    return wanted


def _single(domains: set):
    return next(iter(domains)) if len(domains) == 1 else None


def _choose(lease: Lease, held: list[Held], leaving: set[int], index: FreeIndex
            ) -> list[Slot] | None:
    """Replacements for `leaving` inside the domain the lease's topology constraint promised."""
    order = getattr(lease, "order", None)
    topology = (order.topology if order else {}) or {}
    level = topology.get("required") or topology.get("preferred")
    staying = [h for h in held if h.gpu_id not in leaving]
    return index.take(
        gpu_model=lease.gpu_model, count=len(leaving), max_price=lease.max_price_micros,
        ends_at=lease.ends_at, level=level, required=bool(topology.get("required")),
        keep=_single({h.domain(level) for h in staying}) if staying else None,
        prefer=_single({h.domain(level) for h in held}),
        fabric=_single({h.fabric for h in staying}),
        prefer_fabric=_single({h.fabric for h in held}),
        pool=lease.quota_node.pool_id if lease.quota_node_id else None)


def move_off(*, lease: Lease, held: list[Held], leaving: set[int], index: FreeIndex,
             reason: str) -> bool:
    """Move one lease (locked by the caller) off the GPUs `leaving`, onto replacements from
    the index inside the domain its topology constraint promised; rebind its nodes. False when
    there is no replacement, or when one was taken meanwhile (the exclusion constraint said so)
    even after reading the free GPUs again."""
    for _attempt in range(2):
        chosen = _choose(lease, held, leaving, index)
        if chosen is None:
            return False
        try:
            leasing.move_gpus(lease=lease, away_from=sorted(leaving), reason=reason,
                              onto=[leasing.GpuChoice(s.gpu_id, s.price_micros) for s in chosen])
        except leasing.GpusUnavailable:
            index.refresh(timezone.now())  # stale: another worker took one; read again once
            continue
        rebind(lease)
        return True
    return False


def rebind(lease: Lease) -> None:
    """Bindings follow the allocations in force from the move on: nodes left are told to stop,
    nodes whose GPUs changed are told the new ones."""
    now = timezone.now()
    wanted: dict[int, list[int]] = defaultdict(list)
    for node_id, index in Allocation.objects.filter(lease=lease, period__contains=now).values_list(
            "gpu__node_id", "gpu__index"):
        wanted[node_id].append(index)
    pool.set_lease_bindings(wanted={lease.reference: wanted})

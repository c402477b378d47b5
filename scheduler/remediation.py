"""Remediation: move active leases off failed GPUs and unreachable nodes.

For each active lease holding a GPU that failed (or sits on an unreachable node), look for as
many free, healthy, offered GPUs of the lease's model, priced within its limit, inside the
domain its topology constraint promised (the leaf or spine its other GPUs share); move the
lease there and tell the nodes through their bindings. With no replacement the lease stays
where it is, `degraded` (an event), and the SLA credits cover the downtime.

One pass builds one index of the free GPUs (`scheduler.replacement.FreeIndex`, one query) and
takes every lease's replacements from it; `scheduler.drain` moves leases off drained nodes the
same way (`move_off`).
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
from scheduler.replacement import FreeIndex, domain_of


@dataclass(frozen=True)
class Held:
    """One GPU a lease holds now, where it sits, and whether it is broken."""

    gpu_id: int
    node_id: int
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


def held_now(lease: Lease, now: datetime) -> list[Held]:
    """The lease's GPUs in force now, in one query."""
    rows = Allocation.objects.filter(lease=lease, period__contains=now).values_list(
        "gpu_id", "gpu__node_id", "gpu__node__fabric__name", "gpu__node__host__spine",
        "gpu__node__host__leaf", "gpu__node__hostname", "gpu__health", "gpu__node__health")
    return [Held(gpu, node, fabric, spine, leaf, host,
                 health == Gpu.Health.FAILED or node_health == Node.Health.UNREACHABLE)
            for gpu, node, fabric, spine, leaf, host, health, node_health in rows]


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
    outcome = {}
    affected = sorted(set(
        Allocation.objects.filter(lease__state=Lease.State.ACTIVE, period__contains=now)
        .filter(_broken()).values_list("lease_id", flat=True).distinct()))
    if not affected:
        return outcome
    index = FreeIndex.build(now)
    for lease_id in affected:
        with transaction.atomic():
            lease = lock_active(lease_id)
            if lease is not None:
                outcome[lease_id] = _remediate(lease, index, now)
    return outcome


def _remediate(lease: Lease, index: FreeIndex, now: datetime) -> str:
    held = held_now(lease, now)
    broken = {h.gpu_id for h in held if h.broken}
    if not broken:
        return "moved"  # moved by an overlapping pass meanwhile
    if move_off(lease=lease, held=held, leaving=broken, index=index,
                reason="moved off failed GPUs"):
        return "moved"
    if not LeaseEvent.objects.filter(lease=lease, kind="degraded").exists():
        LeaseEvent.objects.create(lease=lease, kind="degraded", actor="scheduler",
                                  reason=f"no replacement for GPUs {sorted(broken)}")
    return "degraded"


def _single(domains: set):
    return next(iter(domains)) if len(domains) == 1 else None


def move_off(*, lease: Lease, held: list[Held], leaving: set[int], index: FreeIndex,
             reason: str) -> bool:
    """Move the lease (locked by the caller) off the GPUs `leaving`, onto replacements from
    the index inside the domain its topology constraint promised; rebind its nodes. False when
    there is no replacement or it was taken meanwhile (the exclusion constraint said so)."""
    order = getattr(lease, "order", None)
    topology = (order.topology if order else {}) or {}
    level = topology.get("required") or topology.get("preferred")
    staying = [h for h in held if h.gpu_id not in leaving]
    choices = index.take(
        gpu_model=lease.gpu_model, count=len(leaving), max_price=lease.max_price_micros,
        ends_at=lease.ends_at, level=level, required=bool(topology.get("required")),
        keep=_single({h.domain(level) for h in staying}) if staying else None,
        prefer=_single({h.domain(level) for h in held}))
    if choices is None:
        return False
    try:
        leasing.move_gpus(lease=lease, away_from=sorted(leaving), onto=choices, reason=reason)
    except leasing.GpusUnavailable:
        index.discard(c.gpu_id for c in choices)
        return False
    rebind(lease)
    return True


def rebind(lease: Lease) -> None:
    """Bindings follow the allocations in force from the move on: nodes left are told to stop,
    nodes whose GPUs changed are told the new ones."""
    now = timezone.now()
    wanted: dict[int, list[int]] = defaultdict(list)
    for node_id, index in Allocation.objects.filter(lease=lease, period__contains=now).values_list(
            "gpu__node_id", "gpu__index"):
        wanted[node_id].append(index)
    pool.set_lease_bindings(lease_ref=f"L-{lease.pk}", gpu_indexes_by_node=wanted)

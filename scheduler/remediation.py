"""Remediation: move active leases off failed GPUs and unreachable nodes.

For each active lease holding a GPU that failed (or sits on an unreachable node), look for as
many free, healthy, offered GPUs of the lease's model, priced within its limit, inside the
domain its topology constraint promised (the leaf or spine its other GPUs share); move the
lease there and tell the nodes through their bindings. With no replacement the lease stays
where it is, `degraded` (an event), and the SLA credits cover the downtime.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from market import leasing
from market.models import Allocation, Lease, LeaseEvent, Order
from market.orders import free_priced_gpus
from pool import services as pool
from pool.models import Gpu, Node

LEVEL_FIELD = {"leaf": "gpu__node__host__leaf", "spine": "gpu__node__host__spine"}


def broken_gpus_of(lease: Lease, now: datetime) -> list[int]:
    return list(Allocation.objects.filter(lease=lease, period__contains=now).filter(
        _broken()).values_list("gpu_id", flat=True))


def _broken():
    from django.db.models import Q

    return Q(gpu__health=Gpu.Health.FAILED) | Q(gpu__node__health=Node.Health.UNREACHABLE)


def remediate_leases(*, now: datetime | None = None) -> dict[int, str]:
    """Lease id → what was done ("moved" or "degraded") for every lease that needed it."""
    now = now or timezone.now()
    outcome = {}
    affected = (Allocation.objects.filter(lease__state=Lease.State.ACTIVE, period__contains=now)
                .filter(_broken()).values_list("lease_id", flat=True).distinct())
    for lease_id in sorted(set(affected)):
        with transaction.atomic():
            lease = Lease.objects.select_for_update(skip_locked=True).filter(
                pk=lease_id, state=Lease.State.ACTIVE).first()
            if lease is not None:
                outcome[lease_id] = _remediate(lease, now)
    return outcome


def _remediate(lease: Lease, now: datetime) -> str:
    broken = broken_gpus_of(lease, now)
    replacements = _replacements(lease, len(broken), now)
    if replacements is None:
        if not LeaseEvent.objects.filter(lease=lease, kind="degraded").exists():
            LeaseEvent.objects.create(lease=lease, kind="degraded", actor="scheduler",
                                      reason=f"no replacement for GPUs {sorted(broken)}")
        return "degraded"
    try:
        leasing.move_gpus(lease=lease, away_from=broken, onto=replacements,
                          reason="moved off failed GPUs")
    except leasing.GpusUnavailable:
        return "degraded"
    _rebind(lease)
    return "moved"


def _replacements(lease: Lease, count: int, now: datetime):
    """Cheapest free GPUs inside the domain the lease was promised; a `preferred` constraint
    is no promise, so then the same domain comes first and any other will do."""
    order = getattr(lease, "order", None)
    topology = (order.topology if order else {}) or {}
    level = topology.get("required") or topology.get("preferred")
    required = bool(topology.get("required"))
    by_node = free_priced_gpus(Order(gpu_models=[lease.gpu_model], hours=1), now, lease.ends_at)
    keep = _domain_of_remaining(lease, level, now)
    inside, outside = [], []
    for (fabric, spine, leaf, _host), gpus in sorted(by_node.items()):
        affordable = [g for g in gpus if g.price_micros <= lease.max_price_micros]
        domain = {"leaf": (fabric, leaf), "spine": (fabric, spine)}.get(level)
        if keep is None or domain is None or domain == keep:
            inside += affordable
        else:
            outside += affordable
    by_price = sorted(inside, key=lambda g: (g.price_micros, g.gpu_id))
    if not required:
        by_price += sorted(outside, key=lambda g: (g.price_micros, g.gpu_id))
    if len(by_price) < count:
        return None
    return [leasing.GpuChoice(g.gpu_id, g.price_micros) for g in by_price[:count]]


def _domain_of_remaining(lease: Lease, level: str | None, now: datetime):
    if level not in LEVEL_FIELD:
        return None
    rows = set(Allocation.objects.filter(lease=lease, period__contains=now).exclude(_broken())
               .values_list("gpu__node__fabric__name", LEVEL_FIELD[level]))
    return next(iter(rows)) if len(rows) == 1 else None


def _rebind(lease: Lease) -> None:
    """Bindings follow the allocations in force from the move on: nodes left are told to stop."""
    now = timezone.now()
    ref = f"L-{lease.pk}"
    wanted: dict[int, list[int]] = defaultdict(list)
    for node_id, index in Allocation.objects.filter(lease=lease, period__contains=now).values_list(
            "gpu__node_id", "gpu__index"):
        wanted[node_id].append(index)
    for node in Node.objects.filter(bindings__lease_ref=ref).exclude(pk__in=list(wanted)):
        pool.unbind_lease(node=node, lease_ref=ref)
    for node in Node.objects.filter(pk__in=list(wanted)):
        pool.bind_lease(node=node, lease_ref=ref, gpu_indexes=wanted[node.pk])

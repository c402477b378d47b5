"""Remediation: move active leases off failed GPUs, unreachable nodes and hosts cut off from the
fabric.

For each active lease holding a GPU that failed (or sits on an unreachable node), look for as
many free, healthy, offered GPUs of the lease's model, priced within its limit, inside the
domain its topology constraint promised (the leaf or spine its other GPUs share); move the
lease there and tell the nodes through their bindings. With no replacement the lease stays
where it is, `degraded` (an event), and the SLA credits cover the downtime.

One pass builds one index of the free GPUs (`scheduler.moves.free_gpus.FreeIndex`, one
query) and takes every lease's replacements from it. Leases are handled fifty to a
transaction: locked together (skipping those another worker holds), moved with
`market.leasing.move_many` and rebound with `pool.set_lease_bindings`, a few statements a
chunk; if a replacement was taken meanwhile (the exclusion constraint refuses the chunk),
that chunk is redone one lease at a time with `scheduler.moves.one_lease.move_off`, which
draining uses too.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from fabric import selectors as fabric_selectors
from market import leasing, parts
from market.models import Allocation, Lease, LeaseEvent
from pool import services as pool
from pool.models import Gpu, Node
from scheduler.moves.free_gpus import FreeIndex, Slot
from scheduler.moves.one_lease import Held, choose, held_by, move_off, place_parts_again

CHUNK = 50


def _broken() -> Q:
    """An allocation whose GPU failed or whose node went silent."""
    return Q(gpu__health=Gpu.Health.FAILED) | Q(gpu__node__health=Node.Health.UNREACHABLE)


def affected_leases(now: datetime) -> list[int]:
    """Active leases on a broken GPU, or on several hosts one of which the fabric cut off
    (every HCA cable down: scheduler/link_health.py); a lease on one host uses no cable."""
    live = Allocation.objects.filter(lease__state=Lease.State.ACTIVE, period__contains=now)
    broken = set(live.filter(_broken()).values_list("lease_id", flat=True).distinct())
    cut_off = set(live.filter(gpu__node__host__in=fabric_selectors.cut_off_hosts_query())
                  .values_list("lease_id", flat=True).distinct()) - broken
    if cut_off:
        cut_off = set(live.filter(lease_id__in=cut_off).values("lease_id")
                      .annotate(hosts=Count("gpu__node__host_id", distinct=True))
                      .filter(hosts__gt=1).values_list("lease_id", flat=True))
    return sorted(broken | cut_off)


def remediate_leases(*, now: datetime | None = None) -> dict[int, str]:
    """Lease id → what was done ("moved" or "degraded") for every lease that needed it."""
    now = now or timezone.now()
    outcome: dict[int, str] = {}
    affected = affected_leases(now)
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
        if parts.is_parts_lease(lease):  # one node's parts: placed again, all together
            if place_parts_again(lease=lease, reason="moved off failed GPUs"):
                outcome[lease.pk] = "moved"
            else:
                stuck.append((lease, broken))
            continue
        chosen = choose(lease, held[lease.pk], broken, index)
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
            restarted = pool.set_lease_bindings(wanted={
                m.lease.reference: _bindings_after(h, set(m.away_from), chosen)
                for m, h, chosen in planned},
                classes=leasing.bandwidth_classes_of(m.lease for m, _, _ in planned))
            leasing.record_workload_restarts(lease_refs=restarted)
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

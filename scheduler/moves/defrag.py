"""Defragmentation: a periodic pass (`scheduler.defragment`, every DEFRAG_INTERVAL_S) that moves
spot leases whose tenant allowed moves so that whole free nodes and leaves form again.

It reads one snapshot of the offered nodes (GPUs, their current prices, who holds them now and
when each is next allocated), asks the pure planner (`scheduler.placement.defrag`) for moves,
and applies each move in its own transaction through `market.leasing.move_gpus`: the lease is
locked and re-checked (still active, still a consenting spot lease, still on the GPUs the plan
saw), the exclusion constraint decides a race for a target GPU, and a move that fails is
skipped (the next pass plans afresh). Nodes are told through their bindings, as remediation
does. A move never changes what the tenant pays: the new GPUs keep the prices of the GPUs they
replace, and a GPU whose posted price is above what the lease pays is never a target.

Each pass writes a `DefragRun` with the whole free leaf and node counts before it and after it
(measured again after the moves), and logs them.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime

from django.db import transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.db.models import Q
from django.utils import timezone

from ibex.accounts.models import ProviderProfile
from market import leasing, parts
from market.core.parts import PartGpu, share_price_micros, slice_price_micros
from market.models import Allocation, GpuPrice, Lease
from pool.models import Gpu, Node, Pool
from pool.services import offered_gpus
from scheduler.core.placement import defrag as core
from scheduler.core.placement.parts import HeldPart, PartMove, plan_part_moves
from scheduler.models import DefragRun
from scheduler.moves.one_lease import lock_active, rebind

log = logging.getLogger(__name__)
REASON = "defragmentation"


def movable(lease: Lease) -> bool:
    return (lease.tier == Lease.Tier.SPOT and lease.allow_moves
            and lease.state == Lease.State.ACTIVE and lease.preempt_at is None)


def movable_whole(lease: Lease) -> bool:
    """Parts of GPUs are moved by their own planner (`part_snapshot`), never as whole GPUs."""
    return movable(lease) and not parts.is_parts_lease(lease)


def snapshot(now: datetime) -> tuple[list[core.NodeView], list[core.LeaseView]]:
    """The offered nodes (verified provider, active, reachable) and the leases holding GPUs on
    them now, in four queries."""
    gpus = Gpu.objects.filter(
        node__provider__provider_profile__state=ProviderProfile.State.VERIFIED,
        node__state=Node.State.ACTIVE, node__health=Node.Health.REACHABLE,
    ).values_list("id", "node_id", "node__fabric__name", "node__host__leaf",
                  "gpu_model__name", "health", "node__runtime").order_by("node_id", "index")
    prices = dict(GpuPrice.objects.filter(
        Q(superseded_at__isnull=True, min_lease_hours__lte=1, gpu__node__state=Node.State.ACTIVE)
        & (Q(offered_from__isnull=True) | Q(offered_from__lte=now))
    ).exclude(gpu__node__pools__kind=Pool.Kind.PRIVATE)  # never sold: never a move's target
        .values_list("gpu_id", "price_micros"))
    until = dict(GpuPrice.objects.filter(superseded_at__isnull=True,
                                         offered_until__isnull=False,
                                         gpu__node__state=Node.State.ACTIVE)
                 .values_list("gpu_id", "offered_until"))
    held: dict[int, set[int]] = defaultdict(set)
    paid: dict[int, int] = {}
    next_start: dict[int, datetime] = {}
    for lease_id, gpu_id, period, price in Allocation.objects.filter(
            period__overlap=DateTimeTZRange(now, None)).values_list(
            "lease_id", "gpu_id", "period", "price_micros"):
        if period.lower <= now:
            held[lease_id].add(gpu_id)
            paid[lease_id] = min(price, paid.get(lease_id, price))
        elif gpu_id not in next_start or period.lower < next_start[gpu_id]:
            next_start[gpu_id] = period.lower
    by_node: dict[int, list] = defaultdict(list)
    labels = {}
    for gpu_id, node_id, fabric, leaf, model, health, runtime in gpus:
        ends = [t for t in (next_start.get(gpu_id), until.get(gpu_id)) if t is not None]
        by_node[node_id].append(core.GpuSlot(
            id=gpu_id, healthy=health == Gpu.Health.OK, price_micros=prices.get(gpu_id),
            free_until=min(ends).timestamp() if ends else None))
        labels[node_id] = (f"{fabric}/{leaf}", model, fabric, runtime)
    nodes = [core.NodeView(name=str(node_id), leaf=labels[node_id][0],
                           gpu_model=labels[node_id][1], gpus=tuple(slots),
                           fabric=labels[node_id][2], runtime=labels[node_id][3])
             for node_id, slots in by_node.items()]
    leases = [core.LeaseView(id=lease.pk, gpu_model=lease.gpu_model,
                             gpus=frozenset(held[lease.pk]), movable=movable_whole(lease),
                             max_price_micros=paid[lease.pk],
                             ends_at=lease.ends_at.timestamp(),
                             runtimes=leasing.runtimes_of(lease))
              for lease in Lease.objects.filter(pk__in=list(held)).only(
                  "id", "tier", "state", "allow_moves", "preempt_at", "gpu_model", "ends_at",
                  "workload", "ssh_keys", "slurm_account", "mig_profile", "gpu_share")]
    return nodes, leases


def part_snapshot(now: datetime) -> tuple[list[PartGpu], list[HeldPart], dict[str, str]]:
    """The parts held now on offered shareable GPUs, those GPUs with the posted price of each
    kind of part held, and each node's runtime (the part planner's input)."""
    rows = list(Allocation.objects.filter(period__contains=now).exclude(part="whole")
                .select_related("lease").values_list(
                    "lease_id", "gpu_id", "mig_profile", "span", "price_micros",
                    "lease__tier", "lease__allow_moves", "lease__state", "lease__preempt_at"))
    names = {profile or f"share:{span.upper - span.lower}" for _, _, profile, span, *_ in rows}
    gpus = []
    runtime_of = {}
    for (gpu_id, index, host, model, memory, runtime, price,
         slice_prices) in offered_gpus(now=now).filter(
            shareable=True, prices__superseded_at__isnull=True,
            pk__in={row[1] for row in rows}).values_list(
            "id", "index", "node__hostname", "gpu_model__name", "memory_mib", "node__runtime",
            "prices__price_micros", "prices__slice_prices"):
        runtime_of[host] = runtime
        gpus.append(PartGpu(id=gpu_id, node=host, index=index, model=model, memory_mib=memory,
                            part_prices=_part_prices(names, price, slice_prices or {})))
    runtimes = {lease.pk: leasing.runtimes_of(lease) for lease in Lease.objects.filter(
        pk__in={row[0] for row in rows}).only("id", "workload", "ssh_keys", "slurm_account")}
    held = [HeldPart(lease=lease_id, gpu=gpu_id, span=(span.lower, span.upper),
                     mig_profile=profile, paid_micros=price, runtimes=runtimes[lease_id],
                     movable=(tier == Lease.Tier.SPOT and allow_moves and preempt_at is None
                              and state == Lease.State.ACTIVE))
            for (lease_id, gpu_id, profile, span, price, tier, allow_moves, state,
                 preempt_at) in rows]
    return gpus, held, runtime_of


def _part_prices(names: set[str], price: int, slice_prices: dict) -> dict[str, int]:
    prices = {}
    for name in names:
        if name.startswith("share:"):
            prices[name] = share_price_micros(price, int(name.split(":")[1]))
        else:
            prices[name] = slice_price_micros(price, name, slice_prices)
    return prices


def defragment(*, max_moves: int = 20, now: datetime | None = None) -> DefragRun:
    started = now or timezone.now()
    plan = core.plan_defrag(*snapshot(started), max_moves=max_moves)
    record = []
    for move in plan.moves:
        why = _apply(move)
        record.append({"lease": move.lease, "away_from": list(move.away_from),
                       "onto": [gpu for gpu, _ in move.onto], "applied": why == "moved",
                       "why": why})
    part_moves = plan_part_moves(*part_snapshot(timezone.now()),
                                 max_moves=max(0, max_moves - len(plan.moves)))
    for part_move in part_moves:
        why = _apply_part_move(part_move)
        record.append({"lease": part_move.lease, "away_from": [part_move.away_from],
                       "onto": [gpu for gpu, _, _ in part_move.onto], "parts": True,
                       "applied": why == "moved", "why": why})
    after = core.whole_free_counts(*snapshot(timezone.now())) if plan.moves else plan.before
    run = DefragRun.objects.create(
        started_at=started, finished_at=timezone.now(),
        whole_free_leaves_before=plan.before.whole_free_leaves,
        whole_free_leaves_after=after.whole_free_leaves,
        whole_free_nodes_before=plan.before.whole_free_nodes,
        whole_free_nodes_after=after.whole_free_nodes,
        moves_planned=len(plan.moves) + len(part_moves),
        moves_applied=sum(r["applied"] for r in record),
        moves=record)
    log.info("defragmentation: whole free leaves %d -> %d, whole free nodes %d -> %d, "
             "%d of %d moves applied", run.whole_free_leaves_before, run.whole_free_leaves_after,
             run.whole_free_nodes_before, run.whole_free_nodes_after, run.moves_applied,
             run.moves_planned)
    return run


def _apply(move: core.Move) -> str:
    """"moved", or why the move was skipped."""
    with transaction.atomic():
        lease = lock_active(move.lease)
        if lease is None:
            return "lease busy or no longer active"
        if not movable(lease):
            return "lease no longer movable"
        now = timezone.now()
        prices = dict(Allocation.objects.filter(lease=lease, period__contains=now)
                      .values_list("gpu_id", "price_micros"))
        if not set(move.away_from) <= set(prices) or {g for g, _ in move.onto} & set(prices):
            return "lease changed since the snapshot"
        onto = [leasing.GpuChoice(gpu, prices[old])
                for (gpu, _), old in zip(move.onto, move.away_from, strict=True)]
        try:
            leasing.move_gpus(lease=lease, away_from=list(move.away_from), onto=onto,
                              reason=REASON)
        except leasing.GpusUnavailable:
            return "a target GPU was taken meanwhile"
        rebind(lease)
    return "moved"


def _apply_part_move(move: PartMove) -> str:
    """"moved", or why the move of a lease's parts off one GPU was skipped."""
    with transaction.atomic():
        lease = lock_active(move.lease)
        if lease is None:
            return "lease busy or no longer active"
        if not movable(lease):
            return "lease no longer movable"
        now = timezone.now()
        here = list(Allocation.objects.filter(lease=lease, gpu_id=move.away_from,
                                              period__contains=now)
                    .values_list("part", "mig_profile", "price_micros"))
        if len(here) != len(move.onto):
            return "lease changed since the snapshot"
        kind, profile, paid = here[0]
        onto = [leasing.GpuChoice(gpu, paid, part=leasing.Part(kind, span, profile))
                for gpu, span, _ in move.onto]
        try:
            leasing.move_gpus(lease=lease, away_from=[move.away_from], onto=onto,
                              reason=f"{REASON}: a whole GPU freed")
        except leasing.GpusUnavailable:
            return "a target part was taken meanwhile"
        rebind(lease)
    return "moved"

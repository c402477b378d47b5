"""Moving one lease off some of its GPUs, shared by remediation, draining and defragmentation:
what the lease holds now and where, its row lock, replacements from the free-GPU index inside
the domain its topology constraint promised, the move itself, and the rebinding of its nodes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from fabric import selectors as fabric_selectors
from market import leasing, parts
from market.models import Allocation, Lease
from pool import services as pool
from pool.models import Gpu, Node
from scheduler.moves.free_gpus import FreeIndex, Slot, domain_of


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


def held_by(lease_ids: list[int], now: datetime) -> dict[int, list[Held]]:
    """The GPUs each lease holds at `now`, in one query (read it under the leases' locks, with
    the time read after them)."""
    rows = list(Allocation.objects.filter(lease_id__in=lease_ids, period__contains=now)
                .values_list("lease_id", "gpu_id", "gpu__node_id", "gpu__index",
                             "gpu__node__fabric__name", "gpu__node__host__spine",
                             "gpu__node__host__leaf", "gpu__node__hostname", "gpu__health",
                             "gpu__node__health", "gpu__node__host_id"))
    # hosts cut off from the fabric (every HCA cable down) are broken like a silent node, for
    # a lease on several hosts: one on a single host uses no cable
    cut_off = fabric_selectors.cut_off_hosts() if rows else set()
    hosts_of: dict[int, set[int]] = defaultdict(set)
    for row in rows:
        hosts_of[row[0]].add(row[-1])
    held: dict[int, list[Held]] = defaultdict(list)
    for lease, gpu, node, index, fabric, spine, leaf, host, health, node_health, host_id in rows:
        held[lease].append(Held(gpu, node, index, fabric, spine, leaf, host,
                                health == Gpu.Health.FAILED
                                or node_health == Node.Health.UNREACHABLE
                                or (host_id in cut_off and len(hosts_of[lease]) > 1)))
    return held


def held_now(lease: Lease, now: datetime) -> list[Held]:
    return held_by([lease.pk], now)[lease.pk]


def lock_active(lease_id: int) -> Lease | None:
    """The active lease under its row lock (with its order), or None when another worker holds
    it or it is no longer active."""
    return (Lease.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("order").filter(pk=lease_id, state=Lease.State.ACTIVE).first())


def _single(domains: set):
    return next(iter(domains)) if len(domains) == 1 else None


def choose(lease: Lease, held: list[Held], leaving: set[int], index: FreeIndex
            ) -> list[Slot] | None:
    """Replacements for `leaving` inside the domain the lease's topology constraint promised,
    on nodes whose runtime can run what the lease asks."""
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
        pool=lease.quota_node.pool_id if lease.quota_node_id else None,
        runtimes=leasing.runtimes_of(lease))


def move_off(*, lease: Lease, held: list[Held], leaving: set[int], index: FreeIndex,
             reason: str) -> bool:
    """Move one lease (locked by the caller) off the GPUs `leaving`, onto replacements from
    the index inside the domain its topology constraint promised; rebind its nodes. False when
    there is no replacement, or when one was taken meanwhile (the exclusion constraint said so)
    even after reading the free GPUs again."""
    if parts.is_parts_lease(lease):
        return place_parts_again(lease=lease, reason=reason)
    for _attempt in range(2):
        chosen = choose(lease, held, leaving, index)
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
    wanted, node_parts = parts.bindings_of(Allocation.objects.filter(lease=lease,
                                                                     period__contains=now))
    restarted = pool.set_lease_bindings(wanted={lease.reference: wanted},
                                        parts={lease.reference: node_parts},
                                        classes=leasing.bandwidth_classes_of([lease]))
    leasing.record_workload_restarts(lease_refs=restarted)


def place_parts_again(*, lease: Lease, reason: str,
                      avoid_nodes: frozenset[int] = frozenset()) -> bool:
    """Move a lease of parts (locked by the caller; one node's slices or shares) off where it
    is, all its parts at once, onto parts the part placer chooses now, at the prices it pays;
    rebind its nodes. False, changing nothing, when its parts fit nowhere else (its order is
    what says what it bought; a lease without one stays)."""
    order = getattr(lease, "order", None)
    if order is None:
        return False
    now = timezone.now()
    current = list(Allocation.objects.filter(lease=lease, period__contains=now)
                   .values_list("gpu_id", "price_micros"))
    paid = max((price for _, price in current), default=lease.price_micros)
    try:
        with transaction.atomic():
            # its own parts count as free from now on: it may keep the ones still good
            leasing.cut_allocations(lease=lease, at=now)
            found = parts.find_parts(order, now, lease.ends_at, avoid_nodes, limit_micros=paid)
            if isinstance(found, str):
                raise leasing.GpusUnavailable(found)
            onto = [replace(choice, price_micros=paid) for choice in found.choices()]
            leasing.move_parts(lease=lease, onto=onto, at=now, reason=reason,
                               left=[gpu for gpu, _ in current])
    except leasing.GpusUnavailable:
        return False
    rebind(lease)
    return True

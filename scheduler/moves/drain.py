"""Draining nodes: move leases off nodes drained in `move` mode, and take a draining node
offline once nothing runs on it.

A beat (`scheduler.drain_nodes`, every 15 s) is the "next safe point": on each pass every
active lease on a node draining in `move` mode whose tenant allowed moves
(`Lease.allow_moves`) is moved, GPU for GPU, onto free GPUs inside the domain its topology
constraint promised (the same search as remediation, `one_lease.move_off`). With
no replacement the lease stays and the next pass tries again. A lease that did not allow moves,
and every lease on a node draining in `run_to_end` mode, finishes where it is. Either way no new
lease comes to a draining node (only active nodes' GPUs are offered).

Once a draining node holds no allocation of a live lease from now on and every binding on it
has stopped (its agent's heartbeat no longer serves the lease), it goes `offline` (the pool's
state for a node out of service; `active` again when the operator brings it back, or
`retired`). A silent node never confirms, so it stays draining until an operator acts.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from market.leasing import ENDED
from market.models import Allocation, Lease
from pool import services as pool
from pool.models import Binding, Node
from scheduler.moves.free_gpus import FreeIndex
from scheduler.moves.one_lease import held_now, lock_active, move_off

DRAINED_REASON = "node drained"


def drain_nodes(*, now: datetime | None = None) -> dict[str, list[int]]:
    """{"moved": lease ids, "waiting": lease ids without a replacement yet,
    "offline": node ids that finished draining}."""
    now = now or timezone.now()
    moving = set(Node.objects.filter(state=Node.State.DRAINING, drain_mode=Node.DrainMode.MOVE)
                 .values_list("pk", flat=True))
    outcome: dict[str, list[int]] = {"moved": [], "waiting": [], "offline": []}
    lease_ids = sorted(set(
        Allocation.objects.filter(period__contains=now, gpu__node_id__in=moving,
                                  lease__state=Lease.State.ACTIVE, lease__allow_moves=True)
        .values_list("lease_id", flat=True))) if moving else []
    index = FreeIndex.build(now) if lease_ids else None
    for lease_id in lease_ids:
        with transaction.atomic():
            lease = lock_active(lease_id)
            if lease is None:
                continue
            held = held_now(lease, timezone.now())  # as of now, under the lock
            leaving = {h.gpu_id for h in held if h.node_id in moving}
            if not leaving:
                continue
            moved = move_off(lease=lease, held=held, leaving=leaving, index=index,
                             reason=DRAINED_REASON)
            outcome["moved" if moved else "waiting"].append(lease_id)
    outcome["offline"] = _take_empty_nodes_offline(timezone.now())
    return outcome


def _take_empty_nodes_offline(now: datetime) -> list[int]:
    draining = Node.State.DRAINING
    live = Allocation.objects.filter(gpu__node__state=draining,
                                     period__overlap=DateTimeTZRange(now, None)).exclude(
        lease__state__in=list(ENDED))
    # a binding counts until its node says it stopped serving (a heartbeat without the lease)
    busy = (set(live.values_list("gpu__node_id", flat=True))
            | set(Binding.objects.filter(node__state=draining, stopped_at__isnull=True)
                  .values_list("node_id", flat=True)))
    done = []
    for node in Node.objects.filter(state=Node.State.DRAINING).exclude(pk__in=busy):
        try:
            pool.change_node_state(node=node, to_state=Node.State.OFFLINE, actor="scheduler",
                                   reason=f"drained ({node.drain_mode}): no lease left")
        except pool.NodeTransitionError:
            continue  # brought back or retired meanwhile
        done.append(node.pk)
    return done

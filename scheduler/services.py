"""The scheduler's business actions: bind a won lease to its nodes, and activate it once every
node's agent has acknowledged it through its heartbeat.

(The next issue re-runs placement on the current snapshot, retries with backoff and enforces
SLAs; until then the market's proposed placement is bound as it is.)
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from market import leasing
from market.models import Allocation, Lease
from pool import services as pool
from pool.models import Binding, Node


def lease_ref(lease: Lease) -> str:
    return f"L-{lease.pk}"


@transaction.atomic
def place_lease(*, lease_id: int) -> Lease:
    """Bind a pending lease's GPUs on their nodes; delivered twice, it binds once."""
    lease = Lease.objects.select_for_update().get(pk=lease_id)
    if lease.state != Lease.State.PENDING:
        return lease
    lease = leasing.change_lease_state(lease=lease, to_state=Lease.State.PLACING,
                                       actor="scheduler", reason="binding to its nodes")
    indexes: dict[int, list[int]] = defaultdict(list)
    for node_id, index in Allocation.objects.filter(lease=lease).values_list("gpu__node_id",
                                                                             "gpu__index"):
        indexes[node_id].append(index)
    for node in Node.objects.filter(pk__in=list(indexes)).order_by("pk"):
        pool.bind_lease(node=node, lease_ref=lease_ref(lease), gpu_indexes=indexes[node.pk])
    return lease


def activate_acknowledged_leases() -> list[int]:
    """Leases whose every node has acknowledged its binding become active."""
    activated = []
    for lease in Lease.objects.filter(state=Lease.State.PLACING):
        bindings = Binding.objects.filter(lease_ref=lease_ref(lease), serve=True)
        if bindings.exists() and not bindings.filter(acknowledged_at__isnull=True).exists():
            try:
                leasing.change_lease_state(lease=lease, to_state=Lease.State.ACTIVE,
                                           actor="scheduler", reason="every node serves it")
            except leasing.LeaseTransitionError:
                continue  # changed meanwhile (terminated, or activated by an overlapping beat)
            activated.append(lease.pk)
    return activated


def fail_stuck_leases(*, now: datetime | None = None) -> list[int]:
    """Leases still being placed after the timeout fail, with their hold released (the
    tenant pays nothing for a lease that never became active) and a reason."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.PLACING_TIMEOUT_S)
    failed = []
    stuck = Lease.objects.filter(state__in=[Lease.State.PENDING, Lease.State.PLACING],
                                 state_changed_at__lt=cutoff).values_list("pk", flat=True)
    for lease_id in stuck:
        with transaction.atomic():
            lease = Lease.objects.select_for_update(skip_locked=True).filter(
                pk=lease_id, state__in=[Lease.State.PENDING, Lease.State.PLACING]).first()
            if lease is None:
                continue
            waiting = list(Binding.objects.filter(lease_ref=lease_ref(lease), serve=True,
                                                  acknowledged_at__isnull=True)
                           .values_list("node__hostname", flat=True))
            reason = (f"not active after {settings.PLACING_TIMEOUT_S} s: no acknowledgement "
                      f"from {', '.join(sorted(waiting))}" if waiting else
                      f"not placed within {settings.PLACING_TIMEOUT_S} s")
            leasing.change_lease_state(lease=lease, to_state=Lease.State.FAILED,
                                       actor="scheduler", reason=reason)
            failed.append(lease_id)
    return failed

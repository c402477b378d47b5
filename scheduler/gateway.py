"""Gateways: one process reports a whole fabric that a scheduler runs (Slurm, `ibex-agent
slurm`), and turns the leases placed on it into that scheduler's reservations (docs/slurm.md).

One request per interval carries every node of the fabric: what Slurm says of it (down or
drained with its reason, GPUs busy with jobs outside IBEX) and which leases' reservations
exist on it. Each node's part goes through the pool's heartbeat (`pool.services.record_heartbeat`),
so health, remediation, acknowledgement and activation work as for node agents: a lease
becomes active once Slurm holds its reservation on every node. The answer is the reservations
the fabric should hold now; the gateway makes Slurm match it.

A reservation Slurm refused fails that placement: the lease is placed again elsewhere (off those
nodes), and fails with Slurm's message after PLACEMENT_ATTEMPTS.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from fabric.models import Fabric
from ibex.errors import Refusal
from ibex.outbox import services as outbox
from ibex.references import lease_id_of
from market import leasing
from market.models import Allocation, Lease, LeaseEvent
from pool import services as pool
from pool.core.workloads import reservation_name
from pool.models import Binding, Node

KINDS = ("slurm",)
# nodes a lease's refused reservation was on: its next placement avoids them (a hint, kept
# as long as a lease may take to be placed)
AVOID_KEY = "ibex:lease-avoid:{lease_id}"


class GatewayRefused(Refusal):
    code = "invalid"


@dataclass(frozen=True)
class NodeReport:
    hostname: str
    gpus: list[int]  # the GPU indexes the scheduler knows on the node
    down: str = ""  # why the scheduler will not run work there ("" when it will)
    busy: dict[int, str] = field(default_factory=dict)  # GPU index -> what runs on it
    serving: list[str] = field(default_factory=list)  # leases whose reservation holds it


@dataclass(frozen=True)
class RefusedReservation:
    lease: str
    message: str


def avoided_nodes(lease_id: int) -> frozenset[int]:
    """Nodes a lease's last refused reservation was on (placement keeps off them)."""
    return frozenset(cache.get(AVOID_KEY.format(lease_id=lease_id)) or ())


def record_gateway_heartbeat(*, provider, fabric_name: str, kind: str, status: str,
                             nodes: list[NodeReport], refused: list[RefusedReservation],
                             now: datetime | None = None) -> dict:
    """Take a gateway's report of its fabric; answer the reservations it should hold."""
    now = now or timezone.now()
    fabric = Fabric.objects.filter(name=fabric_name, owner=provider).first()
    if fabric is None:
        raise GatewayRefused(f"you have no fabric {fabric_name!r}: import it first",
                             code="not_found", field="fabric")
    Fabric.objects.filter(pk=fabric.pk).update(gateway=kind, gateway_status=status[:300],
                                               gateway_seen_at=now)
    known = {node.hostname: node for node in
             Node.objects.filter(fabric=fabric, provider=provider).exclude(
                 state=Node.State.RETIRED)}
    # Before any heartbeat: a node the gateway reports never takes a lease it cannot reserve.
    Node.objects.filter(pk__in=[n.pk for n in known.values()]).exclude(
        runtime=Node.Runtime.SLURM).update(runtime=Node.Runtime.SLURM)
    interval = settings.NODE_HEARTBEAT_INTERVAL_S
    quiet = pool.record_quiet_heartbeats(now=now, gpus_by_node={
        known[r.hostname].pk: r.gpus for r in nodes
        if r.hostname in known and not (r.down or r.busy or r.serving)})
    for report in nodes:
        node = known.get(report.hostname)
        if node is None or node.pk in quiet:
            continue
        answer = pool.record_heartbeat(
            node=node, gpus=[_gpu_report(report, index) for index in report.gpus], ib_ports=[],
            serving=report.serving, runtime={"kind": Node.Runtime.SLURM}, now=now)
        interval = min(interval, answer.interval_s)
    for refusal in refused:
        reservation_refused(fabric=fabric, lease_ref=refusal.lease, message=refusal.message)
    reported = {report.hostname for report in nodes}
    return {
        "interval_s": interval,
        "reservations": reservations_of(fabric, now),
        "unregistered": sorted(reported - set(known)),
    }


def _gpu_report(report: NodeReport, index: int) -> dict:
    if report.down:
        return {"index": index, "down": f"Slurm: {report.down}"[:500]}
    if index in report.busy:
        return {"index": index, "busy": f"Slurm: {report.busy[index]}"[:500]}
    return {"index": index}


def reservations_of(fabric: Fabric, now: datetime) -> list[dict]:
    """The reservations the fabric should hold now: one per lease bound to its nodes, on
    those nodes, for the lease's Slurm account, until the lease ends (or its notice does)."""
    nodes: dict[str, dict[str, list[int]]] = defaultdict(dict)
    notice: dict[str, datetime] = {}
    for ref, host, indexes, notice_until in Binding.objects.filter(
            node__fabric=fabric, serve=True, stopped_at__isnull=True).values_list(
            "lease_ref", "node__hostname", "gpu_indexes", "notice_until"):
        nodes[ref][host] = sorted(indexes)
        if notice_until is not None:
            notice[ref] = min(notice_until, notice.get(ref, notice_until))
    ids = {ref: lease_id_of(ref) for ref in nodes}
    leases = Lease.objects.in_bulk([i for i in ids.values() if i is not None])
    wanted = []
    for ref in sorted(nodes, key=lambda r: ids[r] or 0):
        lease = leases.get(ids[ref])
        if lease is None:
            continue
        ends_at = min(lease.ends_at, notice.get(ref, lease.ends_at))
        wanted.append({
            "name": reservation_name(ref), "lease": ref, "account": lease.slurm_account,
            "ends_at": ends_at.isoformat(), "nodes": dict(sorted(nodes[ref].items())),
        })
    return wanted


def reservation_refused(*, fabric: Fabric, lease_ref: str, message: str) -> str:
    """Slurm would not reserve a lease's nodes: a lease being placed is placed again off them
    (or fails with Slurm's message after PLACEMENT_ATTEMPTS); an active one keeps its nodes
    and the refusal is in its history (the gateway tries again). What was done."""
    lease_id = lease_id_of(lease_ref)
    reason = f"Slurm refused its reservation: {message}"[:500]
    with transaction.atomic():
        lease = Lease.objects.select_for_update().filter(pk=lease_id).first()
        if lease is None:
            return "unknown lease"
        if lease.state != Lease.State.PLACING:
            last = lease.events.filter(kind="reservation_refused").order_by("-pk").first()
            if last is None or last.reason != reason:
                LeaseEvent.objects.create(lease=lease, kind="reservation_refused",
                                          actor="gateway", reason=reason)
            return "recorded"
        bindings = list(Binding.objects.filter(lease_ref=lease.reference, serve=True)
                        .select_related("node"))
        tries = lease.events.filter(kind="state", from_state=Lease.State.PLACING,
                                    to_state=Lease.State.PENDING).count()
        if tries >= settings.PLACEMENT_ATTEMPTS:
            for binding in bindings:
                pool.unbind_lease(node=binding.node, lease_ref=lease.reference)
            leasing.change_lease_state(lease=lease, to_state=Lease.State.FAILED,
                                       actor="gateway", reason=reason)
            return "failed"
        avoid = {b.node_id for b in bindings if b.node.fabric_id == fabric.pk}
        avoid |= avoided_nodes(lease.pk)
        for binding in bindings:
            pool.unbind_lease(node=binding.node, lease_ref=lease.reference)
        Allocation.objects.filter(lease=lease).delete()
        leasing.change_lease_state(lease=lease, to_state=Lease.State.PENDING, actor="gateway",
                                   reason=f"{reason}: placed again")
        cache.set(AVOID_KEY.format(lease_id=lease.pk), sorted(avoid),
                  timeout=settings.PLACING_TIMEOUT_S * 2)
        outbox.enqueue("scheduler.place_lease", lease.pk)
        return "placed again"

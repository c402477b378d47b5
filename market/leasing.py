"""Leases: the state machine, and holding GPUs for a time range through allocations.

Every state change goes through `change_lease_state`, which re-checks the state under the
row lock and writes a `LeaseEvent`. Allocations rely on PostgreSQL's exclusion constraint:
whatever the code does, one GPU is never in two leases at overlapping times.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.fields import DateTimeRangeField
from django.db import IntegrityError, OperationalError, transaction
from django.db.backends.postgresql.psycopg_any import DateTimeTZRange, NumericRange
from django.db.models import DateTimeField, F, Func, Max, OuterRef, Q, Subquery, Value
from django.utils import timezone
from psycopg import errors

from billing import services as money
from billing.core.money import to_dollars
from fabric.core import qos
from fabric.core.locality import NodeKey
from ibex.accounts.models import Organization
from ibex.audit.services import record_audit
from ibex.db import retry_on_deadlock
from ibex.errors import Refusal
from ibex.references import lease_id_of
from ibex.statemachine import StateMachine, transition
from market.models import Allocation, Lease, LeaseEvent, Order
from market.order_states import release_order_hold
from pool import services as pool
from pool import workloads as pool_workloads
from pool.core.workloads import runtimes_for
from pool.models import Gpu, Node, Pool

S = Lease.State
LEASE_TRANSITIONS = {
    S.PENDING: {S.PLACING, S.FAILED, S.TERMINATED},
    S.PLACING: {S.ACTIVE, S.PENDING, S.FAILED, S.TERMINATED},  # pending: placed again
    S.ACTIVE: {S.COMPLETED, S.TERMINATED, S.PREEMPTING, S.FAILED},
    S.PREEMPTING: {S.PREEMPTED, S.TERMINATED},
    S.PREEMPTED: set(),
    S.COMPLETED: set(),
    S.TERMINATED: set(),
    S.FAILED: set(),
}
ENDED = {S.PREEMPTED, S.COMPLETED, S.TERMINATED, S.FAILED}


def runtimes_of(asking: Order | Lease) -> frozenset[str] | None:
    """The node runtimes an order's or a lease's GPUs may be on: `runtimes_for` what it asks
    (its workload, SSH keys and Slurm account); None: any node."""
    return runtimes_for(asking.workload, asking.ssh_keys, asking.slurm_account)


class LeaseTransitionError(Refusal):
    code = "invalid_state"


class GpusUnavailable(Refusal):
    """Another lease holds one of the GPUs for an overlapping time (the constraint said so)."""

    code = "gpus_unavailable"


LEASE_MACHINE = StateMachine(name="lease", transitions=LEASE_TRANSITIONS,
                             refusal=LeaseTransitionError, history=LeaseEvent,
                             history_of=lambda lease: {"lease": lease})


# --- what a lease holds now ---------------------------------------------------------------------


def bandwidth_classes_of(leases) -> dict[str, str]:
    """Each lease's bandwidth class by its reference, as its order asked (standard for a
    lease no order made): what the pool passes to its partitions (docs/fabric.md)."""
    leases = list(leases)
    # a lease read with select_related("order") answers without a query
    loaded = {lease.pk: getattr(lease, "order", None) for lease in leases
              if Lease.order.is_cached(lease)}
    unread = [lease.pk for lease in leases if lease.pk not in loaded]
    asked = dict(Order.objects.filter(lease__in=unread).values_list(
        "lease_id", "bandwidth_class")) if unread else {}
    asked.update({pk: order.bandwidth_class for pk, order in loaded.items() if order})
    return {lease.reference: asked.get(lease.pk, qos.STANDARD) for lease in leases}


def allocations_in_force():
    """Allocations a lease holds now, or held last if it has ended: those that end where its
    latest allocation ends. GPUs a move or a repair took it off end earlier; they are in the
    lease's events, never in what it lists."""
    upper = Func(F("period"), function="upper", output_field=DateTimeField())
    latest_end = (Allocation.objects.filter(lease=OuterRef("lease")).order_by().values("lease")
                  .annotate(end=Max(upper)).values("end"))
    return Allocation.objects.filter(period__endswith=Subquery(latest_end))


def allocations_in_force_with_places():
    """`allocations_in_force` with what naming GPUs and their locality needs, in node order."""
    return (allocations_in_force().select_related("gpu__node__host", "gpu__node__fabric")
            .order_by("gpu__node__hostname", "gpu__index"))


def allocation_key(allocation: Allocation) -> NodeKey:
    """Where an allocation's GPU sits (select_related gpu__node__host and gpu__node__fabric)."""
    node = allocation.gpu.node
    return NodeKey(node.fabric.name, node.host.spine, node.host.leaf, node.hostname)


def gpu_names(gpu_ids) -> list[str]:
    """GPUs as people read them: `node/index`, in that order."""
    return [f"{host}/{index}" for host, index in Gpu.objects.filter(pk__in=list(gpu_ids))
            .order_by("node__hostname", "index").values_list("node__hostname", "index")]


@dataclass(frozen=True)
class Part:
    """The part of a GPU an allocation holds (market.core.parts): a MIG slice or a share."""

    kind: str  # Allocation.Part: "mig" or "share"
    span: tuple[int, int]  # thousandths of the GPU, [lower, upper)
    mig_profile: str = ""


@dataclass(frozen=True)
class GpuChoice:
    gpu_id: int
    price_micros: int
    part: Part | None = None  # None: the whole GPU

    def allocation(self, lease: Lease, period: DateTimeTZRange) -> Allocation:
        allocation = Allocation(lease=lease, gpu_id=self.gpu_id, period=period,
                                price_micros=self.price_micros)
        if self.part is not None:
            allocation.part, allocation.mig_profile = self.part.kind, self.part.mig_profile
            allocation.span = NumericRange(*self.part.span)
        return allocation


@transaction.atomic
def change_lease_state(*, lease: Lease, to_state: str, actor: str, reason: str) -> Lease:
    """The one way a lease changes state (a fresh copy comes back); an ended lease gives its
    GPUs and what its hold did not capture back."""
    locked = Lease.objects.select_for_update().get(pk=lease.pk)
    transition(LEASE_MACHINE, locked, to_state, actor=actor, reason=reason)
    if to_state in ENDED:
        _unbind(locked)
        _release_from(locked, timezone.now())
        _release_hold(locked, reason=f"lease {locked.pk} {to_state}")
        if locked.quota_node_id is not None:  # a private pool's lease: GPU-hours, not money
            _account_gpu_hours(locked)
    return locked


def _release_hold(lease: Lease, reason: str) -> None:
    """Give the tenant back what the order's hold did not capture (the last partial minute,
    metered after the end, is charged from the available balance)."""
    order = Order.objects.filter(lease=lease).first()
    if order is not None:
        release_order_hold(order, actor="market", reason=reason)


def _unbind(lease: Lease) -> None:
    """Ask the lease's nodes to stop serving it (their next heartbeat answer says so)."""
    for node in Node.objects.filter(gpus__allocations__lease=lease).distinct():
        pool.unbind_lease(node=node, lease_ref=lease.reference)


def _release_from(lease: Lease, moment: datetime) -> None:
    """Give the GPUs back from `moment` on: cut each allocation's range there."""
    for allocation in Allocation.objects.filter(lease=lease):
        lower = allocation.period.lower
        if moment <= lower:
            allocation.delete()
        elif allocation.period.upper is None or moment < allocation.period.upper:
            allocation.period = DateTimeTZRange(lower, moment)
            allocation.save(update_fields=["period"])


@contextlib.contextmanager
def _gpus_must_be_free(message: str) -> Iterator[None]:
    """Write allocations inside: when the exclusion constraint finds one of their GPUs in
    another allocation at the same time, the writes are undone (a savepoint, so the caller's
    transaction goes on) and GpusUnavailable(message) says so. PostgreSQL decides, not a check
    made before the insert, so two workers racing for one GPU cannot both win.

    Two transactions inserting allocations of one GPU at the same instant each wait for the
    other's row while checking the constraint, and PostgreSQL breaks the tie by failing one as
    a deadlock: for that one, too, another lease took the GPU (its savepoint is undone alone)."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        if "no_gpu_in_two_overlapping_allocations" not in str(exc):
            raise
        raise GpusUnavailable(message) from None
    except OperationalError as exc:
        if not (isinstance(exc.__cause__, errors.DeadlockDetected)
                and 'exclusion constraint on tuple' in str(exc)
                and f'"{Allocation._meta.db_table}"' in str(exc)):
            raise
        raise GpusUnavailable(message) from None


@transaction.atomic
def create_lease(*, tenant: Organization, tier: str, gpu_model: str, gpus: list[GpuChoice],
                 starts_at: datetime, ends_at: datetime, price_micros: int,
                 max_price_micros: int, locality: dict, actor: str,
                 allow_moves: bool = False, reason: str = "created",
                 workload: dict | None = None, ssh_keys: list[str] = (),
                 slurm_account: str = "", mig_profile: str = "",
                 gpu_share: int | None = None) -> Lease:
    """A pending lease holding `gpus` (or parts of them) over [starts_at, ends_at), or
    GpusUnavailable; `reason` says how it was won, for its history; `workload`, `ssh_keys`,
    `slurm_account` and the part sold (`mig_profile` or `gpu_share`) come from its order."""
    lease = Lease.objects.create(
        tenant=tenant, tier=tier, gpu_model=gpu_model, gpu_count=len(gpus),
        mig_profile=mig_profile, gpu_share=gpu_share,
        price_micros=price_micros, max_price_micros=max_price_micros, starts_at=starts_at,
        ends_at=ends_at, locality=locality, allow_moves=allow_moves, workload=workload,
        ssh_keys=list(ssh_keys), slurm_account=slurm_account,
    )
    LeaseEvent.objects.create(lease=lease, to_state=S.PENDING, actor=actor, reason=reason)
    period = DateTimeTZRange(starts_at, ends_at)
    with _gpus_must_be_free("another lease holds one of these GPUs at that time"):
        Allocation.objects.bulk_create([
            g.allocation(lease, period) for g in sorted(gpus, key=lambda g: g.gpu_id)])
    return lease


def complete_ended_leases(*, now: datetime | None = None) -> list[int]:
    """Leases past their end time complete; each is claimed under its row lock, so
    overlapping beats complete it once."""
    now = now or timezone.now()
    completed = []
    for lease_id in Lease.objects.filter(state=S.ACTIVE, ends_at__lte=now).values_list(
            "pk", flat=True):
        with transaction.atomic():
            lease = Lease.objects.select_for_update(skip_locked=True).filter(
                pk=lease_id, state=S.ACTIVE).first()
            if lease is None:
                continue
            change_lease_state(lease=lease, to_state=S.COMPLETED, actor="market",
                               reason="its end time came")
            completed.append(lease_id)
    return completed


@retry_on_deadlock
@transaction.atomic
def terminate_lease(*, lease: Lease, actor: str, reason: str = "terminated by the tenant") -> Lease:
    lease = change_lease_state(lease=lease, to_state=S.TERMINATED, actor=actor, reason=reason)
    record_audit(action="lease.terminate", target=lease, actor=actor,
                 organization=lease.tenant, details={"reason": reason[:500]})
    return lease


class ExtensionRefused(Refusal):
    """The tenant cannot pay for the longer lease: `code` as for a refused order."""


@transaction.atomic
def extend_lease(*, lease: Lease, hours: int, actor: str) -> Lease:
    """Push the end later when every GPU stays free and the tenant can pay for the extra hours.

    The extra cost (each GPU's price for the added hours) is held on the order exactly as an
    order's maximum cost is, or the extension is refused as an order would be
    (ExtensionRefused, `insufficient_funds` or `spend_limit_exceeded`), changing nothing. The
    exclusion constraint decides whether the GPUs stay free.
    """
    order_id = Order.objects.filter(lease_id=lease.pk).values_list("pk", flat=True).first()
    if order_id is not None:  # lock order: the tenant's accounts, then the lease
        money.lock_tenant_balances(tenant=lease.tenant)
    locked = Lease.objects.select_for_update().get(pk=lease.pk)
    if locked.state in ENDED:
        raise LeaseTransitionError(f"a {locked.state} lease cannot be extended")
    new_end = locked.ends_at + timedelta(hours=hours)
    extra = extension_cost_micros(locked, hours)
    with _gpus_must_be_free("another lease holds one of these GPUs after this one ends"):
        for allocation in Allocation.objects.filter(lease=locked,
                                                    period__endswith=locked.ends_at):
            allocation.period = DateTimeTZRange(allocation.period.lower, new_end)
            allocation.save(update_fields=["period"])
    if order_id is not None and locked.quota_node_id is None and extra > 0:
        try:
            money.add_to_hold(tenant=locked.tenant, order_ref=f"order-{order_id}",
                              amount_micros=extra, actor=actor,
                              reason=f"lease {locked.pk} extended by {hours} h")
        except money.MoneyError as exc:
            raise ExtensionRefused(exc.message, code=exc.code) from None
    LeaseEvent.objects.create(lease=locked, kind="extended", actor=actor,
                              reason=f"extended by {hours} h to {new_end:%Y-%m-%d %H:%M}")
    locked.ends_at = new_end
    locked.save(update_fields=["ends_at"])
    record_audit(action="lease.extend", target=locked, actor=actor, organization=locked.tenant,
                 amount_micros=extra,
                 details={"hours": hours, "ends_at": new_end.isoformat()})
    return locked


def extension_cost_micros(lease: Lease, hours: int) -> int:
    """What `hours` more cost at the prices of the GPUs the lease holds at its end."""
    prices = Allocation.objects.filter(lease=lease, period__endswith=lease.ends_at).values_list(
        "price_micros", flat=True)
    return hours * sum(prices)


@transaction.atomic
def move_gpus(*, lease: Lease, away_from: list[int], onto: list[GpuChoice], reason: str,
              actor: str = "scheduler") -> Lease:
    """Move part of an active lease from some GPUs onto others, from now to its end: the old
    allocations are cut now, the new ones start now (the exclusion constraint still decides),
    and a `moved` event records both sides."""
    locked = Lease.objects.select_for_update().get(pk=lease.pk)
    if locked.state not in (S.ACTIVE, S.PREEMPTING):
        raise LeaseTransitionError(f"a {locked.state} lease is not moved")
    now = timezone.now()
    for allocation in Allocation.objects.filter(lease=locked, gpu_id__in=away_from,
                                                period__overlap=DateTimeTZRange(now, None)):
        if allocation.period.lower >= now:
            allocation.delete()
        else:
            allocation.period = DateTimeTZRange(allocation.period.lower, now)
            allocation.save(update_fields=["period"])
    with _gpus_must_be_free("a replacement GPU was taken meanwhile"):
        Allocation.objects.bulk_create([
            g.allocation(locked, DateTimeTZRange(now, locked.ends_at)) for g in onto])
    LeaseEvent.objects.create(lease=locked, kind="moved", actor=actor,
                              reason=f"{reason}: {', '.join(gpu_names(away_from))} → "
                                     f"{', '.join(gpu_names(g.gpu_id for g in onto))}"[:500])
    return locked


def cut_allocations(*, lease: Lease, at: datetime) -> None:
    """End what the lease holds at `at` (allocations starting later are dropped)."""
    in_force = Allocation.objects.filter(lease=lease, period__overlap=DateTimeTZRange(at, None))
    in_force.filter(period__startswith__gte=at).delete()
    in_force.update(period=Func(Func(F("period"), function="lower"), Value(at),
                                function="tstzrange", output_field=DateTimeRangeField()))


@transaction.atomic
def move_parts(*, lease: Lease, onto: list[GpuChoice], at: datetime, reason: str,
               left: list[int], actor: str = "scheduler") -> Lease:
    """A lease of parts (locked by the caller, its allocations cut at `at`) holds `onto` from
    `at` to its end (the exclusion constraints decide: GpusUnavailable); a `moved` event
    records both sides."""
    if lease.state not in (S.ACTIVE, S.PREEMPTING):
        raise LeaseTransitionError(f"a {lease.state} lease is not moved")
    with _gpus_must_be_free("a part was taken meanwhile"):
        Allocation.objects.bulk_create([
            g.allocation(lease, DateTimeTZRange(at, lease.ends_at))
            for g in sorted(onto, key=lambda g: g.gpu_id)])
    LeaseEvent.objects.create(lease=lease, kind="moved", actor=actor,
                              reason=f"{reason}: {', '.join(gpu_names(left))} → "
                                     f"{', '.join(gpu_names(g.gpu_id for g in onto))}"[:500])
    return lease


@transaction.atomic
def replace_allocations(*, lease: Lease, gpus: list[GpuChoice], gpu_model: str, locality: dict,
                        price_micros: int, reason: str, starts_at: datetime,
                        actor: str = "scheduler") -> Lease:
    """Put a lease that is not placed yet on other GPUs, from `starts_at` to its end: its
    allocations are rewritten (the exclusion constraint decides any race: GpusUnavailable)
    and a `moved` event records both sides."""
    locked = Lease.objects.select_for_update().get(pk=lease.pk)
    if locked.state != S.PENDING:
        raise LeaseTransitionError(f"a {locked.state} lease is not re-placed")
    Allocation.objects.filter(lease=locked).delete()
    period = DateTimeTZRange(max(starts_at, locked.starts_at), locked.ends_at)
    with _gpus_must_be_free("another lease took one of these GPUs meanwhile"):
        Allocation.objects.bulk_create([
            g.allocation(locked, period) for g in sorted(gpus, key=lambda g: g.gpu_id)])
    LeaseEvent.objects.create(lease=locked, kind="moved", actor=actor,
                              reason=f"{reason}; now on "
                                     f"{', '.join(gpu_names(g.gpu_id for g in gpus))}"[:500])
    locked.gpu_model, locked.locality = gpu_model, locality
    locked.price_micros = min(price_micros, locked.max_price_micros)
    locked.save(update_fields=["gpu_model", "locality", "price_micros"])
    return locked


def record_workload_restarts(*, lease_refs: list[str], actor: str = "scheduler") -> None:
    """Leases whose nodes changed restart their command on the new nodes with the new
    addresses (docs/workloads.md): their history says so."""
    ids = [lease_id for lease_id in map(lease_id_of, lease_refs) if lease_id is not None]
    LeaseEvent.objects.bulk_create([
        LeaseEvent(lease_id=lease_id, kind="workload_restarted", actor=actor,
                   reason="moved: the command was stopped on the nodes it left and started "
                          "again on every node with the new addresses") for lease_id in ids])


@dataclass(frozen=True)
class PlannedMove:
    lease: Lease  # locked by the caller
    away_from: list[int]
    onto: list[GpuChoice]
    reason: str


@transaction.atomic
def move_many(*, moves: list[PlannedMove], actor: str = "scheduler") -> None:
    """`move_gpus` for many leases in a handful of queries, all or nothing (a remediation pass
    moves hundreds). The caller holds the leases' row locks. GpusUnavailable when any new GPU
    is held meanwhile: nothing moved, and the caller can move them one by one."""
    if not moves:
        return
    for move in moves:
        if move.lease.state not in (S.ACTIVE, S.PREEMPTING):
            raise LeaseTransitionError(f"a {move.lease.state} lease is not moved")
    now = timezone.now()
    leaving = Q()
    for move in moves:
        leaving |= Q(lease_id=move.lease.pk, gpu_id__in=move.away_from)
    # only what is in force now or later: an allocation of the same GPU that already ended
    # (the lease left it before) stays as it is
    cut = Allocation.objects.filter(leaving, period__overlap=DateTimeTZRange(now, None))
    cut.filter(period__startswith__gte=now).delete()
    cut.update(period=Func(Func(F("period"), function="lower"), Value(now), function="tstzrange",
                           output_field=DateTimeRangeField()))
    with _gpus_must_be_free("a replacement GPU was taken meanwhile"):
        # in GPU order, so two workers inserting overlapping sets wait, not deadlock
        Allocation.objects.bulk_create(sorted((
            g.allocation(m.lease, DateTimeTZRange(now, m.lease.ends_at))
            for m in moves for g in m.onto), key=lambda a: a.gpu_id))
    LeaseEvent.objects.bulk_create([
        LeaseEvent(lease=m.lease, kind="moved", actor=actor,
                   reason=f"{m.reason}: GPUs {sorted(m.away_from)} → "
                          f"{sorted(g.gpu_id for g in m.onto)}") for m in moves])


# --- private pools: GPU-hours, and preemption with notice --------------------------------------


def used_micro_gpu_hours(lease: Lease) -> int:
    """What a lease held, from its (cut) allocations, in micro-GPU-hours."""
    seconds = 0
    for (period,) in Allocation.objects.filter(lease=lease).values_list("period"):
        if period.upper is not None:
            seconds += max(0, int((period.upper - period.lower).total_seconds()))
    return seconds * money.MICROS_PER_HOUR // 3600


def _account_gpu_hours(lease: Lease) -> None:
    """An ended pool lease's GPU-hours go to the ledger, from the pool's owner to the tenant."""
    owner = Pool.objects.filter(quota_nodes=lease.quota_node_id).values_list("owner",
                                                                             flat=True).get()
    money.record_quota_usage(owner=Organization.objects.get(pk=owner), tenant=lease.tenant,
                             lease_id=lease.pk, queue_id=lease.quota_node_id,
                             micro_gpu_hours=used_micro_gpu_hours(lease))


def give_notice(*, lease: Lease, reason: str, now: datetime, actor: str,
                reason_before_start: str | None = None) -> Lease:
    """Preempt a lease with the spot notice (auctions outbid it, a private pool reclaims it):
    it becomes preempting until `preempt_at`, when `end_preempted_leases` ends it. A lease
    not yet running has nothing to be warned about: it ends at once."""
    if lease.state in (S.PENDING, S.PLACING):
        return change_lease_state(lease=lease, to_state=S.TERMINATED, actor=actor,
                                  reason=reason_before_start or f"{reason} (before it started)")
    lease = change_lease_state(lease=lease, to_state=S.PREEMPTING, actor=actor, reason=reason)
    notice_at = now + timedelta(seconds=settings.PREEMPTION_NOTICE_S)
    Lease.objects.filter(pk=lease.pk).update(preempt_at=notice_at)
    lease.preempt_at = notice_at
    pool_workloads.give_notice(lease_ref=lease.reference, until=notice_at)
    return lease


# --- operators' refunds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseCancellation:
    lease_id: int
    state: str
    refunded_micros: int
    detail: str


@transaction.atomic
def cancel_lease_with_refund(*, lease_id: int, actor: str, reason: str) -> LeaseCancellation:
    """An operator settles a dispute: the lease ends now (terminated; its GPUs come free and the
    unused hold goes back to the tenant) and everything the tenant was charged for it so far
    comes back to the tenant's available balance, in one transaction (`refund_lease_charges`
    says how). Refunding a lease twice refunds nothing more (checked under the lease's row
    lock). The last partial minute, metered after the end, is billed as usual and not part of
    the refund."""
    if not reason.strip():
        raise money.MoneyError("say why the lease is cancelled", field="reason")
    lease = Lease.objects.select_for_update().select_related("tenant").get(pk=lease_id)
    if lease.state not in ENDED:
        lease = change_lease_state(lease=lease, to_state=S.TERMINATED, actor=actor,
                                   reason=f"cancelled by an operator: {reason}")
    refunded = money.refund_lease_charges(tenant=lease.tenant, lease_id=lease.pk, actor=actor,
                                          reason=reason)
    if refunded is None:
        return LeaseCancellation(lease.pk, lease.state, 0, f"lease {lease.pk} was already refunded")
    if refunded == 0:
        return LeaseCancellation(lease.pk, lease.state, 0,
                                 f"lease {lease.pk} {lease.state}; nothing was charged for it")
    return LeaseCancellation(lease.pk, lease.state, refunded,
                             f"lease {lease.pk} {lease.state}; {to_dollars(refunded)} USD refunded")

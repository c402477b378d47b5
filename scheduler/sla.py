"""Service levels: the terms each lease is sold with, measuring them from the pool's health
events, and crediting breaches through the ledger without anyone asking.

Terms per tier (stored per lease in `LeaseSla` when the lease is first seen):
- on-demand: GPU availability 99.5 % over the lease; active within 60 s of winning;
- reserved: GPU availability 99.9 % over the lease; active within 60 s of its start;
- spot: none (interruptible by design);
- multi-node leases also record the locality promised at sale (the lease's `locality`).

Credits (`evaluate_lease`, every 60 s from a beat for active and recently ended leases):
- availability below target: down GPU-hours × the lease's price × SLA_CREDIT_MULTIPLIER (5),
  capped at what the lease has cost so far (its usage records); a GPU is down while it failed,
  while its node is unreachable, and, for a guaranteed lease, while its guaranteed bandwidth
  is broken on the fabric's routes with nowhere to move it (`bandwidth_broken` until
  `bandwidth_restored`, scheduler.guarantees: a link fault);
- late activation (more than 60 s from winning, or from its start if later, to active): one
  hour of the lease's price × its GPUs. A lease is created only with GPUs that were free, so the
  clock never includes waiting for capacity; a lease that never became active is not owed it.
Each run credits only what is owed beyond earlier credits, in a `SlaCredit` row whose window
starts where the last one ended (unique per lease and window start): re-runs never pay twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from billing import services as money
from billing.core.money import to_dollars
from billing.models import UsageRecord
from fabric.core.locality import Locality, NodeKey
from market import leasing
from market.models import Allocation, Lease, LeaseEvent
from notify import events
from notify.models import Event
from pool.models import HealthEvent
from pool.services import UNREACHABLE_AFTER_INTERVALS
from scheduler.core import sla as measure_core
from scheduler.models import LeaseSla, SlaCredit

log = logging.getLogger(__name__)

AVAILABILITY_TARGET_BP = {Lease.Tier.ON_DEMAND: 9950, Lease.Tier.RESERVED: 9990}
ACTIVATION_LIMIT_S = {Lease.Tier.ON_DEMAND: 60, Lease.Tier.RESERVED: 60}
ACTIVE_STATES = (Lease.State.ACTIVE, Lease.State.PREEMPTING)


def credit_multiplier() -> int:
    return int(getattr(settings, "SLA_CREDIT_MULTIPLIER", 5))


def ended_grace() -> timedelta:
    return timedelta(seconds=int(getattr(settings, "SLA_ENDED_GRACE_S", 3600)))


# --- terms ----------------------------------------------------------------------------------------


def terms_for(lease: Lease) -> dict:
    multi_node = (lease.locality or {}).get("max_hops", 0) > 0
    return {"tier": lease.tier,
            "availability_target_bp": AVAILABILITY_TARGET_BP.get(lease.tier),
            "activation_limit_s": ACTIVATION_LIMIT_S.get(lease.tier),
            "promised_locality": dict(lease.locality) if multi_node else {}}


def ensure_sla(lease: Lease) -> LeaseSla:
    """The lease's terms, stored the first time the lease is seen (never changed after)."""
    found = LeaseSla.objects.filter(lease=lease).first()
    if found is not None:
        return found
    try:
        with transaction.atomic():
            return LeaseSla.objects.create(lease=lease, **terms_for(lease))
    except IntegrityError:  # stored meanwhile by an overlapping run
        return LeaseSla.objects.get(lease=lease)


# --- measurement ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuDowntime:
    gpu: str
    seconds: int
    spans: list[tuple[datetime, datetime]]


@dataclass(frozen=True)
class Measurement:
    won_at: datetime
    active_at: datetime | None
    ended_at: datetime | None
    measured_until: datetime
    lease_gpu_seconds: int
    down_gpu_seconds: int
    activation_s: int | None
    activation_late: bool
    gpus: list[GpuDowntime] = field(default_factory=list)

    @property
    def availability(self):
        return measure_core.availability(self.down_gpu_seconds, self.lease_gpu_seconds)


def _moments(lease: Lease) -> tuple[datetime, datetime | None, datetime | None]:
    won_at = active_at = ended_at = None
    for to_state, at in LeaseEvent.objects.filter(lease=lease).exclude(to_state="").order_by(
            "at", "id").values_list("to_state", "at"):
        if to_state == Lease.State.PENDING and won_at is None:
            won_at = at
        elif to_state == Lease.State.ACTIVE and active_at is None:
            active_at = at
        elif to_state in leasing.ENDED and ended_at is None:
            ended_at = at
    return won_at or lease.created_at, active_at, ended_at


def measure(lease: Lease, sla: LeaseSla, now: datetime) -> Measurement:
    """Availability and activation time of the lease, from its start to `now` (or its end)."""
    won_at, active_at, ended_at = _moments(lease)
    activation_s = None
    late = False
    if active_at is not None:
        activation_s = max(0, int((active_at - max(won_at, lease.starts_at)).total_seconds()))
        late = sla.activation_limit_s is not None and activation_s > sla.activation_limit_s
    until = min(now, ended_at or now, lease.ends_at)
    if active_at is None or until <= active_at:
        return Measurement(won_at, active_at, ended_at, until, 0, 0, activation_s, late)
    lease_gpu_seconds = lease.gpu_count * int((until - active_at).total_seconds())
    allocations = list(Allocation.objects.filter(lease=lease).select_related("gpu__node"))
    node_ids = {a.gpu.node_id for a in allocations}
    gpu_ids = {a.gpu_id for a in allocations}
    node_events: dict[int, list] = {n: [] for n in node_ids}
    gpu_events: dict[int, list] = {g: [] for g in gpu_ids}
    rows = (HealthEvent.objects.filter(at__lte=until)
            .filter(Q(node_id__in=node_ids, gpu__isnull=True) | Q(gpu_id__in=gpu_ids))
            .order_by("at", "id").values_list("node_id", "gpu_id", "kind", "to_value", "at"))
    for node_id, gpu_id, kind, to_value, at in rows:
        if gpu_id is None:
            node_events[node_id].append((at, kind))
        elif kind == HealthEvent.Kind.GPU_HEALTH:
            gpu_events[gpu_id].append((at, to_value))
    link = measure_core.link_signals(LeaseEvent.objects.filter(
        lease=lease, kind__in=("bandwidth_broken", "bandwidth_restored"), at__lte=until)
        .order_by("at", "id").values_list("at", "kind"))
    downtimes, down_total = [], 0
    for allocation in sorted(allocations, key=lambda a: (a.gpu.node.hostname, a.gpu.index)):
        gpu = allocation.gpu
        lead = timedelta(seconds=UNREACHABLE_AFTER_INTERVALS * gpu.node.heartbeat_interval_s)
        signals = (measure_core.node_signals(node_events[gpu.node_id], lead)
                   + measure_core.gpu_signals(gpu_events[gpu.pk]) + link)
        spans = measure_core.down_spans(signals, until)
        upper = allocation.period.upper or until
        window = (max(active_at, allocation.period.lower), min(until, upper))
        seconds = measure_core.overlap_seconds(spans, window)
        if seconds:
            clipped = [(max(s, window[0]), min(e, window[1])) for s, e in spans
                       if min(e, window[1]) > max(s, window[0])]
            downtimes.append(GpuDowntime(f"{gpu.node.hostname}/gpu{gpu.index}", seconds, clipped))
            down_total += seconds
    return Measurement(won_at, active_at, ended_at, until, lease_gpu_seconds, down_total,
                       activation_s, late, downtimes)


def locality_now(lease: Lease, at: datetime) -> dict:
    """Where the lease's GPUs sit at `at`, in the terms it was sold with (leaves, spines,
    max_hops), to compare with the promised locality after a move."""
    keys = [NodeKey(fabric, spine, leaf, host) for fabric, spine, leaf, host, period in
            Allocation.objects.filter(lease=lease).values_list(
                "gpu__node__fabric__name", "gpu__node__host__spine", "gpu__node__host__leaf",
                "gpu__node__hostname", "period")
            if period.lower <= at and (period.upper is None or at < period.upper)]
    return Locality.of(keys).to_json()


def locality_kept(promised: dict, now: dict) -> bool:
    """No farther apart than sold (no promise, or no GPUs held now: nothing to break)."""
    if not promised or not now:
        return True
    return now["max_hops"] <= promised.get("max_hops", now["max_hops"])


def cost_so_far_micros(lease: Lease) -> int:
    """What the lease has been billed (usage refs are `L-<id>:<provider>:<price>`)."""
    total = UsageRecord.objects.filter(lease_ref__startswith=f"{lease.reference}:").aggregate(
        total=Sum("charge_micros"))["total"]
    return total or 0


def credited_micros(lease: Lease) -> int:
    return SlaCredit.objects.filter(lease=lease).aggregate(total=Sum("amount_micros"))["total"] or 0


def _percent(bp: int | None) -> str:
    return "none" if bp is None else f"{bp / 100:.2f}%"


def _reason(lease, sla, m: Measurement, o: measure_core.Owed, amount: int, before: int) -> str:
    parts = [f"lease {lease.pk} SLA"]
    if o.availability_micros:
        worst = ", ".join(f"{g.gpu} {g.seconds} s" for g in m.gpus[:4])
        more = f" and {len(m.gpus) - 4} more" if len(m.gpus) > 4 else ""
        hours = m.down_gpu_seconds / 3600
        parts.append(
            f"availability {m.availability * 100:.4f}% < {_percent(sla.availability_target_bp)}"
            f" ({m.down_gpu_seconds} of {m.lease_gpu_seconds} GPU-s down: {worst}{more});"
            f" {hours:.4f} GPU-h x {to_dollars(lease.price_micros)} x {credit_multiplier()}"
            + (" capped at the cost so far" if o.capped else "")
            + f" = {to_dollars(o.availability_micros)}")
    if o.activation_micros:
        parts.append(f"active {m.activation_s} s after winning > {sla.activation_limit_s} s:"
                     f" 1 h x {lease.gpu_count} GPUs x {to_dollars(lease.price_micros)}"
                     f" = {to_dollars(o.activation_micros)}")
    parts.append(f"credited {to_dollars(amount)} (owed {to_dollars(o.total_micros)},"
                 f" credited before {to_dollars(before)})")
    return "; ".join(parts)[:500]


def _provider_of(lease: Lease):
    allocation = Allocation.objects.filter(lease=lease).select_related(
        "gpu__node__provider").order_by("id").first()
    return allocation.gpu.node.provider if allocation else None


def owed_for(lease: Lease, sla: LeaseSla, m: Measurement) -> measure_core.Owed:
    return measure_core.owed(
        down_gpu_seconds=m.down_gpu_seconds, lease_gpu_seconds=m.lease_gpu_seconds,
        target_bp=sla.availability_target_bp, price_micros=lease.price_micros,
        multiplier=credit_multiplier(), cost_so_far_micros=cost_so_far_micros(lease),
        activation_late=m.activation_late, gpus=lease.gpu_count)


def evaluate_lease(*, lease: Lease, now: datetime | None = None) -> SlaCredit | None:
    """Measure the lease and credit what it is owed beyond earlier credits; None if nothing.

    Safe to re-run and to run twice at once: the credit row's window starts where the last
    credit's ended, and (lease, window start) is unique.
    """
    now = now or timezone.now()
    sla = ensure_sla(lease)
    m = measure(lease, sla, now)
    LeaseSla.objects.filter(pk=sla.pk).update(measured_at=now, down_gpu_seconds=m.down_gpu_seconds,
                                              lease_gpu_seconds=m.lease_gpu_seconds)
    o = owed_for(lease, sla, m)
    last = SlaCredit.objects.filter(lease=lease).order_by("-window_end").first()
    before = credited_micros(lease)
    amount = o.total_micros - before
    window_start = last.window_end if last else m.won_at
    if amount <= 0 or now <= window_start:
        return None
    provider = _provider_of(lease)
    if provider is None:
        return None
    reason = _reason(lease, sla, m, o, amount, before)
    with transaction.atomic():
        try:
            with transaction.atomic():
                credit = SlaCredit.objects.create(
                    lease=lease, window_start=window_start, window_end=now,
                    down_gpu_seconds=m.down_gpu_seconds, lease_gpu_seconds=m.lease_gpu_seconds,
                    activation_s=m.activation_s, owed_micros=o.total_micros,
                    amount_micros=amount, reason=reason)
        except IntegrityError:
            return None  # credited meanwhile by an overlapping run
        credit.transaction = money.grant_sla_credit(
            tenant=lease.tenant, provider=provider, amount_micros=amount,
            lease_ref=lease.reference, reason=reason, actor="sla")
        credit.save(update_fields=["transaction"])
        events.record_event(
            lease=lease, kind=Event.Kind.CREDITED, source=f"sla_credit:{credit.pk}",
            occurred_at=now, payload={
                "lease": lease.pk, "credit": credit.pk, "amount": to_dollars(amount),
                "availability": str(m.availability), "down_gpu_seconds": m.down_gpu_seconds,
                "activation_s": m.activation_s, "reason": reason})
    return credit


def leases_to_evaluate(now: datetime):
    return Lease.objects.filter(
        Q(state__in=ACTIVE_STATES)
        | Q(state__in=list(leasing.ENDED), state_changed_at__gte=now - ended_grace())
    ).exclude(tier=Lease.Tier.SPOT).select_related("tenant").order_by("pk")


def evaluate_slas(*, now: datetime | None = None) -> list[int]:
    """The beat's SLA pass: store terms of leases seen for the first time, credit breaches."""
    now = now or timezone.now()
    for lease in Lease.objects.filter(sla__isnull=True).exclude(state__in=list(leasing.ENDED)):
        ensure_sla(lease)
    credited = []
    for lease in leases_to_evaluate(now):
        try:
            credit = evaluate_lease(lease=lease, now=now)
        except money.MoneyError as exc:
            log.warning("could not credit lease %s: %s", lease.pk, exc.message)
            continue
        if credit is not None:
            credited.append(credit.pk)
    return credited


def sla_report(lease: Lease, now: datetime | None = None) -> dict:
    """Terms, the measurement so far and the credits, for the API."""
    now = now or timezone.now()
    sla = ensure_sla(lease)
    m = measure(lease, sla, now)
    o = owed_for(lease, sla, m)
    at = m.measured_until - timedelta(microseconds=1)  # allocations end at the lease's end
    current = locality_now(lease, at)
    return {"sla": sla, "measurement": m, "owed": o, "locality_now": current,
            "locality_kept": locality_kept(sla.promised_locality, current),
            "cost_so_far_micros": cost_so_far_micros(lease),
            "credits": list(SlaCredit.objects.filter(lease=lease).order_by("window_start"))}

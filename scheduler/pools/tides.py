"""Tidal schedules: at set times a pool's quota moves between organisations or purposes.

`apply_due_steps` (a beat task) finds, per pool, the latest step that is due (a daily time
today or yesterday, or a one-off moment in the past) and applies it once (`TidalRun` is
unique per step and due time): the named quota nodes get their new nominals, the leases of
queues now above their new nominal give way with the spot preemption notice
(`pool.core.quotas.apply_schedule` + `give_way`: lowest priority, newest first, never more than
needed), and an admission pass is queued. `check_in_force` (run after every admission pass)
stamps `in_force_at` once the leases given notice have ended and no queued order that fits
within its queue's new nominal is left waiting: how long the new split took to be in force.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from ibex.outbox import services as outbox
from market import leasing, pool_orders
from market.models import Lease, Order
from pool import quotas
from pool.core import quotas as core
from pool.models import Pool, Quota, TidalRun, TidalStep
from scheduler.pools.running import running_of


def due_at(step: TidalStep, now: datetime) -> datetime | None:
    """The latest moment at or before `now` when the step was due (None: not yet)."""
    if step.at is not None:
        return step.at if step.at <= now else None
    today = datetime.combine(now.astimezone(UTC).date(), step.daily_at, tzinfo=UTC)
    return today if today <= now else today - timedelta(days=1)


def latest_due(pool: Pool, now: datetime) -> tuple[TidalStep, datetime] | None:
    """The step in force now: of all steps due, the one due last (earlier ones are past)."""
    due = [(at, step.name, step) for step in TidalStep.objects.filter(pool=pool)
           if (at := due_at(step, now)) is not None]
    if not due:
        return None
    at, _, step = max(due, key=lambda d: (d[0], d[1]))
    return step, at


def apply_due_steps(*, now: datetime | None = None) -> list[TidalRun]:
    now = now or timezone.now()
    runs = []
    for pool in Pool.objects.filter(tidal_steps__isnull=False).distinct():
        found = latest_due(pool, now)
        if found is None or TidalRun.objects.filter(step=found[0], due_at=found[1]).exists():
            continue
        run = apply_step(step=found[0], due=found[1], now=now)
        if run is not None:
            runs.append(run)
    return runs


def _set_nominal(pool: Pool, node: str, model: str, nominal: int) -> None:
    quota = Quota.objects.select_for_update().filter(node__pool=pool, node__name=node,
                                                     gpu_model__name=model).first()
    if quota is None:
        row = pool.quota_nodes.get(name=node)
        quotas.set_quota(node=row, gpu_model=model, nominal=nominal)
        return
    lending = quota.lending_limit
    quotas.set_quota(node=quota.node, gpu_model=model, nominal=nominal,
                     borrowing_limit=quota.borrowing_limit,
                     lending_limit=None if lending is None else min(lending, nominal))


@transaction.atomic
def apply_step(*, step: TidalStep, due: datetime, now: datetime) -> TidalRun | None:
    """Apply one step: new nominals, notice to the leases that must give way. Applied once
    per due time (a second beat finds the run and does nothing)."""
    pool = Pool.objects.select_for_update().get(pk=step.pool_id)
    try:
        with transaction.atomic():
            run = TidalRun.objects.create(step=step, due_at=due, started_at=now,
                                          notice_s=settings.PREEMPTION_NOTICE_S)
    except IntegrityError:
        return None
    for node, models in sorted(step.nominals.items()):
        for model, nominal in sorted(models.items()):
            _set_nominal(pool, node, model, int(nominal))
    tree = quotas.quota_tree(pool)
    holding = [lease for lease in pool_orders.pool_leases(pool).order_by("pk")
               if lease.state != Lease.State.PREEMPTING]
    running = running_of(holding)
    change = core.apply_schedule(tree, core.TidalSchedule([(0, {})]), 0, core.usage_of(running))
    victims = core.give_way(running, change.excess)
    by_id = {str(lease.pk): lease for lease in holding}
    for victim in victims:
        leasing.give_notice(lease=by_id[victim], now=now, actor="scheduler",
                                reason=f"tidal schedule {step.name}: quota moved")
    run.gpus_to_give_way = sum(gpus for _, _, gpus in change.excess)
    run.leases_preempted = len(victims)
    run.lease_ids = [int(v) for v in victims]
    run.save(update_fields=["gpus_to_give_way", "leases_preempted", "lease_ids"])
    outbox.enqueue("scheduler.admit_pool", pool.pk)
    return run


def check_in_force(*, pool: Pool, now: datetime) -> list[int]:
    """Stamp the pool's open tidal runs whose new split is in force now."""
    open_runs = list(TidalRun.objects.filter(step__pool=pool, in_force_at__isnull=True))
    if not open_runs:
        return []
    tree = quotas.quota_tree(pool)
    usage = core.usage_of(running_of(pool_orders.pool_leases(pool)))
    for order in Order.objects.filter(pool=pool, state=Order.State.QUEUED).select_related(
            "quota_node"):
        queue, model = order.quota_node.name, order.gpu_models[0]
        if core.used_by(usage, queue, model) + order.gpus <= tree.nominal(queue, model):
            return []  # an order that fits within its new nominal still waits
    stamped = []
    for run in open_runs:
        if Lease.objects.filter(pk__in=run.lease_ids,
                                state__in=pool_orders.HOLDING).exists():
            continue
        if TidalRun.objects.filter(pk=run.pk, in_force_at__isnull=True).update(in_force_at=now):
            stamped.append(run.pk)
    return stamped

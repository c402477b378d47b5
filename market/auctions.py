"""Frequent batch auctions: each interval, per market (GPU model), clear the resting spot and
reserved orders together with `market.core.clearing`, turn winners into leases at the uniform
price, and give running spot leases priced out a preemption notice.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from fabric.core.locality import WIDEST_FIRST, Locality, NodeKey
from ibex.outbox import services as outbox
from market import leasing, parts
from market.core import clearing
from market.core.parts import gpu_fraction
from market.models import Clearing, Lease, Order
from market.order_states import OS, change_order_state, release_order_hold
from market.orders import (
    FreeGpu,
    bid_for,
    free_priced_gpus,
    offers_from,
)
from pool.models import Gpu

AUCTION_TIERS = (Lease.Tier.SPOT, Lease.Tier.RESERVED)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def interval_start(now: datetime, interval_s: int) -> datetime:
    seconds = int((now - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=seconds - seconds % interval_s)


def markets_with_bids() -> list[str]:
    models = set()
    for names in Order.objects.filter(state=OS.RESTING, tier__in=AUCTION_TIERS).values_list(
            "gpu_models", flat=True):
        models.update(names)
    return sorted(models)


def clear_markets(*, now: datetime | None = None) -> list[Clearing]:
    """Clear every market with resting bids, once per interval."""
    now = now or timezone.now()
    start = interval_start(now, settings.AUCTION_INTERVAL_S)
    done = []
    for model in markets_with_bids():
        cleared = clear_market(gpu_model=model, interval=start, now=now)
        if cleared is not None:
            done.append(cleared)
    return done


@transaction.atomic
def clear_market(*, gpu_model: str, interval: datetime, now: datetime) -> Clearing | None:
    try:
        with transaction.atomic():
            record = Clearing.objects.create(gpu_model=gpu_model, interval_start=interval)
    except IntegrityError:
        return None  # another beat cleared this market for this interval
    orders = list(Order.objects.select_for_update(skip_locked=True).filter(
        state=OS.RESTING, tier__in=AUCTION_TIERS, gpu_models__contains=[gpu_model]))
    orders = [o for o in orders if not _expired(o, now)]
    whole = [o for o in orders if not parts.is_parts(o)]
    if whole:
        _clear(record, whole, gpu_model, now)
    part_orders = [o for o in orders if parts.is_parts(o)]
    if part_orders:
        _clear_parts(record, part_orders, now)
    return record


def _clear_parts(record: Clearing, orders: list[Order], now: datetime) -> None:
    """Spot slices and shares, after the whole-GPU bids: the highest limit per GPU-hour
    first, each at the posted price of its parts (never above its limit), where they fit; the
    others rest until the next clearing, with the reason."""
    def limit_per_gpu_hour(order: Order) -> tuple:
        numerator, denominator = gpu_fraction(order.mig_profile, order.gpu_share)
        return (-Fraction(order.max_price_micros * denominator, numerator), order.created_at,
                order.pk)

    for order in sorted(orders, key=limit_per_gpu_hour):
        end = now + timedelta(hours=order.hours)
        found = parts.find_parts(order, now, end)
        lease = None
        if not isinstance(found, str):
            try:
                lease = leasing.create_lease(
                    tenant=order.tenant, tier=order.tier, gpu_model=found.gpu_model,
                    gpus=found.choices(), starts_at=now, ends_at=end,
                    price_micros=found.price_micros(order.max_price_micros),
                    max_price_micros=order.max_price_micros, locality=found.locality(),
                    actor="market", allow_moves=order.allow_moves, workload=order.workload,
                    ssh_keys=order.ssh_keys, slurm_account=order.slurm_account,
                    mig_profile=order.mig_profile, gpu_share=order.gpu_share,
                    reason=f"order {order.pk} filled at {now:%Y-%m-%d %H:%M} UTC's clearing")
            except leasing.GpusUnavailable as exc:
                found = str(exc)
        if lease is None:
            Order.objects.filter(pk=order.pk).update(reason=found)
            record.refused = [*record.refused, {"order": order.pk, "reason": found}]
            continue
        outbox.enqueue("scheduler.place_lease", lease.pk)
        order.lease = lease
        change_order_state(order, OS.FILLED, actor="market",
                           reason=f"filled at the posted {lease.price_micros} µ$ per part-hour")
        record.accepted = [*record.accepted, {"order": order.pk, "lease": lease.pk,
                                              "gpus": order.gpus, "parts": True,
                                              "price_micros": lease.price_micros}]
    record.save(update_fields=["accepted", "refused"])


def _expired(order: Order, now: datetime) -> bool:
    if order.tier == Lease.Tier.RESERVED and order.start_latest and order.start_latest < now:
        release_order_hold(order, actor="market", reason="its start window passed")
        change_order_state(order, OS.EXPIRED, actor="market", reason="its start window passed unfilled")
        return True
    return False


def _starts_at(order: Order, now: datetime) -> datetime:
    if order.tier == Lease.Tier.RESERVED and order.start_earliest and order.start_earliest > now:
        return order.start_earliest
    return now


def _clear(record: Clearing, orders: list[Order], gpu_model: str, now: datetime) -> None:
    # Capacity: GPUs free from now to the farthest end any bid needs (conservative: a GPU
    # counted here is free for every bid's range).
    horizon = max(_starts_at(o, now) + timedelta(hours=o.hours) for o in orders)
    # every node's GPUs, whatever it runs: the clearing keeps each bid off the nodes whose
    # runtime cannot run what it asks (`bid_for`)
    probe = Order(gpu_models=[gpu_model], hours=1)
    runtimes: dict[str, str] = {}
    by_node = free_priced_gpus(probe, now, horizon, runtime_of=runtimes, any_runtime=True)
    models = dict(Gpu.objects.filter(pk__in=[g[0].gpu_id for g in by_node.values()])
                  .values_list("node__hostname", "gpu_model__name"))
    by_id = {str(o.pk): o for o in orders}
    market = clearing.clear_market(WIDEST_FIRST, offers_from(by_node, models, runtimes),
                                   [bid_for(o) for o in orders], parts.placer_with_mix(),
                                   gpu_model=gpu_model)
    keys = {key.host: key for key in by_node}
    accepted = []
    for won in market.accepted:
        order = by_id[won.bid.id]
        chosen = _gpus_taken(by_node, keys, won.reserves_micros)
        lease = _lease(order, chosen, won.price_micros, now)
        if lease.starts_at <= now:
            # placed at once, through the outbox like on-demand leases; a reserved lease that
            # starts later is queued by the scheduler's sweeper once its start has come
            outbox.enqueue("scheduler.place_lease", lease.pk)
        order.lease = lease
        change_order_state(order, OS.FILLED, actor="market", reason=f"won at {won.price_micros} µ$/GPU-hour")
        accepted.append({"order": order.pk, "lease": lease.pk, "gpus": order.gpus,
                         "price_micros": won.price_micros})
    refused = []
    for lost in market.refused:
        order = by_id[lost.bid.id]
        Order.objects.filter(pk=order.pk).update(reason=lost.reason)
        refused.append({"order": order.pk, "reason": lost.reason})
    record.price_micros = market.clearing_price_micros
    record.gpus_sold = sum(a["gpus"] for a in accepted)
    record.accepted, record.refused = accepted, refused
    if market.exact is not None:
        record.exact = {"welfare": str(market.exact.welfare),
                        "greedy_welfare": str(market.exact.greedy_welfare),
                        "gap": str(market.exact.gap), "optimal": market.exact.optimal}
    record.save()
    if record.price_micros is not None:
        notify_preemptions(gpu_model=gpu_model, price_micros=record.price_micros, now=now)


def _gpus_taken(by_node, keys, reserves) -> list[tuple[NodeKey, FreeGpu]]:
    chosen = []
    for node, prices in reserves.items():
        key = keys[node]
        wanted = defaultdict(int)
        for price in prices:
            wanted[price] += 1
        for gpu in by_node[key]:
            if wanted[gpu.price_micros] > 0:
                wanted[gpu.price_micros] -= 1
                chosen.append((key, gpu))
        by_node[key] = [g for g in by_node[key] if (key, g) not in chosen]
    return chosen


def _lease(order: Order, chosen, price_micros: int, now: datetime) -> Lease:
    keys = [k for k, _ in chosen]
    start = _starts_at(order, now)
    return leasing.create_lease(
        tenant=order.tenant, tier=order.tier, gpu_model=order.gpu_models[0],
        gpus=[leasing.GpuChoice(g.gpu_id, price_micros) for _, g in chosen],
        starts_at=start, ends_at=start + timedelta(hours=order.hours), price_micros=price_micros,
        max_price_micros=order.max_price_micros,
        locality=Locality.of(keys).to_json(),
        actor="market", allow_moves=order.allow_moves, workload=order.workload,
        ssh_keys=order.ssh_keys, slurm_account=order.slurm_account,
        reason=f"order {order.pk} won at {now:%Y-%m-%d %H:%M} UTC's clearing",
    )


# --- spot preemption ----------------------------------------------------------------------------


def notify_preemptions(*, gpu_model: str, price_micros: int, now: datetime) -> list[int]:
    """Running spot leases whose limit is below the new price get a notice, then end."""
    running = Lease.objects.filter(tier=Lease.Tier.SPOT, gpu_model=gpu_model,
                                   state__in=[Lease.State.PENDING, Lease.State.PLACING,
                                              Lease.State.ACTIVE])
    chosen = clearing.spot_leases_to_preempt(
        [clearing.SpotLease(str(lease.pk), _limit_per_gpu_hour(lease)) for lease in running],
        price_micros)
    preempted = []
    for lease_id in chosen:
        lease = leasing.give_notice(
            lease=Lease.objects.get(pk=int(lease_id)), now=now, actor="market",
            reason=f"clearing price {price_micros} µ$/GPU-hour is above its limit",
            reason_before_start="priced out before it started")
        if lease.state == Lease.State.PREEMPTING:
            preempted.append(lease.pk)
    return preempted


def _limit_per_gpu_hour(lease: Lease) -> int:
    """A spot lease's limit per GPU-hour: a part's limit scaled to the whole GPU (a share of
    250 at $0.50 bids as $2.00 per GPU-hour), so parts and whole GPUs are priced out alike."""
    numerator, denominator = gpu_fraction(lease.mig_profile, lease.gpu_share)
    return lease.max_price_micros * denominator // numerator


def end_preempted_leases(*, now: datetime | None = None) -> list[int]:
    now = now or timezone.now()
    ended = []
    for lease in Lease.objects.filter(state=Lease.State.PREEMPTING, preempt_at__lte=now):
        try:
            leasing.change_lease_state(lease=lease, to_state=Lease.State.PREEMPTED,
                                       actor="market", reason="preemption notice ran out")
        except leasing.LeaseTransitionError:
            continue  # ended meanwhile
        ended.append(lease.pk)
    return ended

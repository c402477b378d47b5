"""Frequent batch auctions: each interval, per market (GPU model), clear the resting spot and
reserved orders together with `market.core.clearing`, turn winners into leases at the uniform
price, and give running spot leases priced out a preemption notice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from fabric.core.locality import WIDEST_FIRST, Locality, NodeKey
from ibex.outbox import services as outbox
from market import guarantees, leasing, parts
from market.core import book as books
from market.core import clearing, winners
from market.core.parts import gpu_fraction
from market.models import Clearing, Lease, Order
from market.order_states import OS, change_order_state, release_order_hold
from market.orders import (
    FoundGpus,
    FreeGpu,
    bid_for,
    domain_candidates,
    free_priced_gpus,
    offers_from,
    own_shape,
    shapes_of,
)

AUCTION_TIERS = (Lease.Tier.SPOT, Lease.Tier.RESERVED)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def interval_start(now: datetime, interval_s: int) -> datetime:
    seconds = int((now - EPOCH).total_seconds())
    return EPOCH + timedelta(seconds=seconds - seconds % interval_s)


def models_of(order: Order) -> set[str]:
    """Every market an order may win in: its models, or those of any of its alternatives."""
    return {model for shape in [own_shape(order), *order.alternatives]
            for model in shape["gpu_models"]}


def markets_with_bids() -> list[str]:
    resting = Order.objects.filter(state=OS.RESTING, tier__in=AUCTION_TIERS).only(
        "gpu_models", "gpus", "hours", "max_price_micros", "topology", "alternatives")
    return sorted({model for order in resting for model in models_of(order)})


def clear_markets(*, now: datetime | None = None) -> list[Clearing]:
    """Clear every market with resting bids, once per interval, together: a bid over
    alternatives in several markets is weighed against all of them at once."""
    now = now or timezone.now()
    start = interval_start(now, settings.AUCTION_INTERVAL_S)
    return clear_interval(gpu_models=markets_with_bids(), interval=start, now=now)


def clear_market(*, gpu_model: str, interval: datetime, now: datetime) -> Clearing | None:
    """One market's clearing of an interval; None if it was cleared already."""
    cleared = clear_interval(gpu_models=[gpu_model], interval=interval, now=now)
    return cleared[0] if cleared else None


@transaction.atomic
def clear_interval(*, gpu_models: list[str], interval: datetime, now: datetime) -> list[Clearing]:
    records: dict[str, Clearing] = {}
    for model in sorted(gpu_models):
        try:
            with transaction.atomic():
                records[model] = Clearing.objects.create(gpu_model=model,
                                                         interval_start=interval)
        except IntegrityError:
            continue  # another beat cleared this market for this interval
    if not records:
        return []
    orders = [o for o in Order.objects.select_for_update(skip_locked=True)
              .filter(state=OS.RESTING, tier__in=AUCTION_TIERS).order_by("pk")
              if models_of(o) & set(records)]
    orders = [o for o in orders if not _expired(o, now)]
    whole = [o for o in orders if not parts.is_parts(o)]
    if whole:
        _clear(records, whole, now)
    for model, record in records.items():
        part_orders = [o for o in orders if parts.is_parts(o) and model in o.gpu_models
                       and o.state == OS.RESTING]
        if part_orders:
            _clear_parts(record, part_orders, now)
    return list(records.values())


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


def _bid(order: Order, markets: set[str]) -> tuple[clearing.Bid | winners.AlternativeBid, list[int]] | None:
    """The order as the clearing takes it, its shapes limited to the markets being cleared,
    with the position in the order's own alternatives of each shape kept; None when no shape
    is in those markets (another beat clears them)."""
    shapes, positions = [], []
    for position, shape in enumerate(shapes_of(order)):
        models = [m for m in shape["gpu_models"] if m in markets]
        if models:
            shapes.append(bid_for(order, {**shape, "gpu_models": models}))
            positions.append(position)
    if not shapes:
        return None
    if len(shapes) == 1:
        return shapes[0], positions
    return winners.AlternativeBid(str(order.pk), tuple(shapes), order.created_at), positions


def _clear(records: dict[str, Clearing], orders: list[Order], now: datetime) -> None:
    # Capacity: GPUs free from now to the farthest end any bid needs (conservative: a GPU
    # counted here is free for every bid's range).
    horizon = max(_starts_at(o, now) + timedelta(hours=shape["hours"])
                  for o in orders for shape in shapes_of(o))
    # every node's GPUs, whatever it runs: the clearing keeps each bid off the nodes whose
    # runtime cannot run what it asks (`bid_for`)
    runtimes: dict[str, str] = {}
    by_node: dict[NodeKey, list[FreeGpu]] = {}
    model_of: dict[str, str] = {}
    for model in records:
        found = free_priced_gpus(Order(gpu_models=[model], hours=1), now, horizon,
                                 runtime_of=runtimes, any_runtime=True)
        by_node.update(found)
        model_of.update({key.host: model for key in found})
    bids, positions, by_id = [], {}, {}
    for order in orders:
        made = _bid(order, set(records))
        if made is not None:
            bids.append(made[0])
            positions[str(order.pk)] = made[1]
            by_id[str(order.pk)] = order
    offers = offers_from(by_node, model_of, runtimes)
    result = winners.clear_welfare(WIDEST_FIRST, offers, bids,
                                   time_limit_s=settings.AUCTION_TIME_LIMIT_S)
    book = books.book_json(WIDEST_FIRST, offers, bids)
    keys = {key.host: key for key in by_node}
    free = FreeForWinners(by_node, keys, model_of, runtimes)
    for market in result.markets:
        record = records[market.gpu_model]
        accepted, refused = [], []
        for won in market.accepted:
            order = by_id[won.bid.id]
            filled = _fill(order, won, positions[won.bid.id][won.alternative],
                           market.gpu_model, free, now)
            if filled is not None:
                accepted.append(filled)
                continue
            reason = ("won, but another lease took its GPUs while the clearing ran; it rests "
                      "for the next clearing")
            Order.objects.filter(pk=order.pk).update(reason=reason)
            refused.append({"order": order.pk, "reason": reason, "price_to_win_micros": None})
        refused += [_refuse(by_id[lost.bid.id], lost, positions[lost.bid.id])
                    for lost in market.refused]
        record.price_micros = market.clearing_price_micros
        record.gpus_sold = sum(a["gpus"] for a in accepted)
        record.accepted, record.refused = accepted, refused
        record.welfare, record.welfare_bound = market.welfare, market.welfare_bound
        record.gap, record.optimal, record.book = market.gap, market.optimal, book
        record.save()
        if record.price_micros is not None:
            notify_preemptions(gpu_model=market.gpu_model, price_micros=record.price_micros,
                               now=now)
    # Markets with bids but no free GPU: every bid there is refused, and the price is the
    # highest of their limits, so running spot leases bid below it are priced out as before.
    cleared = {market.gpu_model for market in result.markets}
    for model, record in records.items():
        if model in cleared:
            continue
        limits = [shape["max_price_micros"] for o in orders for shape in shapes_of(o)
                  if model in shape["gpu_models"]]
        record.price_micros = max(limits, default=None)
        record.refused = [{"order": o.pk, "reason": f"no {model} GPUs are free for the hours "
                                                    "asked", "price_to_win_micros": None}
                          for o in orders if model in models_of(o) and o.state == OS.RESTING]
        record.welfare = record.welfare_bound = record.gap = 0
        record.optimal, record.book = True, book
        record.save()
        if record.price_micros is not None:
            notify_preemptions(gpu_model=model, price_micros=record.price_micros, now=now)
    for lost in result.refused:  # named no market with free GPUs in this clearing
        Order.objects.filter(pk=by_id[lost.bid.id].pk).update(
            reason=lost.reason[:500], price_to_win_micros=None,
            price_to_win_reason=(lost.price_to_win_reason or "no GPUs it may use are free for "
                                 "the hours asked")[:300])


@dataclass
class FreeForWinners:
    """The GPUs the clearing saw free, less those its winners have taken so far."""

    by_node: dict[NodeKey, list[FreeGpu]]
    keys: dict[str, NodeKey]
    model_of: dict[str, str]
    runtimes: dict[str, str]

    def take(self, reserves: dict[str, list[int]]) -> list[tuple[NodeKey, FreeGpu]]:
        """GPUs of each node at the reserve prices the clearing assigned."""
        chosen = []
        for node, prices in reserves.items():
            key = self.keys[node]
            wanted = defaultdict(int)
            for price in prices:
                wanted[price] += 1
            for gpu in self.by_node[key]:
                if wanted[gpu.price_micros] > 0:
                    wanted[gpu.price_micros] -= 1
                    chosen.append((key, gpu))
        self.remove(chosen)
        return chosen

    def remove(self, chosen: list[tuple[NodeKey, FreeGpu]]) -> None:
        taken = {(key, gpu.gpu_id) for key, gpu in chosen}
        for key in {key for key, _ in chosen}:
            self.by_node[key] = [g for g in self.by_node[key] if (key, g.gpu_id) not in taken]

    def give_back(self, chosen: list[tuple[NodeKey, FreeGpu]]) -> None:
        for key, gpu in chosen:
            self.by_node[key].append(gpu)


def _fill(order: Order, won: winners.Winner, alternative: int, gpu_model: str,
          free: FreeForWinners, now: datetime) -> dict | None:
    """The winner's lease on the GPUs it won; None, with nothing changed, when an on-demand
    order took one of them while the clearing ran (the database refuses the overlap)."""
    try:
        with transaction.atomic():
            return _fill_now(order, won, alternative, gpu_model, free, now)
    except leasing.GpusUnavailable:
        return None


def _fill_now(order: Order, won: winners.Winner, alternative: int, gpu_model: str,
              free: FreeForWinners, now: datetime) -> dict:
    if order.alternatives:  # the order now says which of its shapes it bought
        shape = order.alternatives[alternative]
        order.gpus, order.hours = shape["gpus"], shape["hours"]
        order.max_price_micros, order.topology = shape["max_price_micros"], shape["topology"]
        order.gpu_models = shape["gpu_models"]
    order.alternative = alternative
    order.price_to_win_micros, order.price_to_win_reason = None, ""
    order.save(update_fields=["gpus", "hours", "max_price_micros", "topology", "gpu_models",
                              "alternative", "price_to_win_micros", "price_to_win_reason"])
    chosen = free.take(won.reserves_micros)
    if guarantees.is_guaranteed(order):
        chosen = _most_headroom(order, chosen, won.price_micros, gpu_model, free, now)
    lease = _lease(order, chosen, won.price_micros, now, gpu_model)
    if lease.starts_at <= now:
        # placed at once, through the outbox like on-demand leases; a reserved lease that
        # starts later is queued by the scheduler's sweeper once its start has come
        outbox.enqueue("scheduler.place_lease", lease.pk)
    order.lease = lease
    change_order_state(order, OS.FILLED, actor="market",
                       reason=f"won at {won.price_micros} µ$/GPU-hour"
                              + (f" (alternative {alternative + 1} of {len(order.alternatives)})"
                                 if order.alternatives else ""))
    return {"order": order.pk, "lease": lease.pk, "gpus": order.gpus,
            "alternative": alternative, "price_micros": won.price_micros}


def _most_headroom(order: Order, chosen: list, price_micros: int, gpu_model: str,
                   free: FreeForWinners, now: datetime) -> list[tuple[NodeKey, FreeGpu]]:
    """A guaranteed winner's GPUs: the clearing's, or the engine's choice inside another leaf
    or spine whose guarantee keeps more headroom on the routes (docs/fabric.md, "Admission on
    the real routes"), among GPUs no dearer in reserves in all than the clearing's (so the
    welfare it certified does not fall) and each at or below the price. Where none holds its
    guarantee, the clearing's: its placement checks it again and moves or fails it."""
    free.give_back(chosen)
    usable = {key: [g for g in gpus if g.price_micros <= price_micros]
              for key, gpus in free.by_node.items() if free.model_of[key.host] == gpu_model}
    usable = {key: gpus for key, gpus in usable.items() if gpus}
    budget = sum(gpu.price_micros for _, gpu in chosen)
    candidates = [FoundGpus(chosen=chosen, gpu_model=gpu_model)] + [
        found for found in domain_candidates(order, usable, free.model_of, free.runtimes)
        if sum(gpu.price_micros for _, gpu in found.chosen) <= budget]
    start = _starts_at(order, now)
    index, _verdict = guarantees.choose(order, [c.gpus_by_node() for c in candidates], start,
                                        start + timedelta(hours=order.hours))
    best = candidates[index or 0].chosen
    free.remove(best)
    return best


def _refuse(order: Order, lost: winners.Loser, positions: list[int]) -> dict:
    reason = lost.price_to_win_reason
    if lost.price_to_win_micros is not None and order.alternatives:
        reason = (f"alternative {positions[lost.price_to_win_alternative]}"
                  + (f": {reason}" if reason else ""))
    Order.objects.filter(pk=order.pk).update(
        reason=lost.reason[:500], price_to_win_micros=lost.price_to_win_micros,
        price_to_win_reason=reason[:300])
    return {"order": order.pk, "reason": lost.reason,
            "price_to_win_micros": lost.price_to_win_micros}


def _lease(order: Order, chosen, price_micros: int, now: datetime, gpu_model: str) -> Lease:
    keys = [k for k, _ in chosen]
    start = _starts_at(order, now)
    return leasing.create_lease(
        tenant=order.tenant, tier=order.tier, gpu_model=gpu_model,
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

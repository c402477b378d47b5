"""Quotes: `POST /api/v1/quote/`, what an order would get now, placing nothing
(docs/api-offers.md).

The body is an order's (`POST /api/v1/orders/`) and is refused the same way. Then, in one
transaction that is always rolled back, the order is taken as `market.orders.place_order`
takes it, without saving it: its maximum cost is held (a refusal there is the quote's reason)
and the placement engine runs on the GPUs free now (`market.orders.find_gpus`, the code an
on-demand order is matched by). Whatever the hold wrote is rolled back, so a quote leaves no
order, no hold, no lease and no ledger row; it takes the tenant's balance lock for the moment
it checks, as an order does.

- **on demand**: the answer is the order's: when nothing changes meanwhile, an order placed
  right after a fillable quote is filled at the quoted price on the quoted GPUs.
- **spot and reserved**: an estimate. They are filled at the next clearing of their market,
  every winner at one uniform price: at least the highest reserve price among the GPUs the
  engine would give them (the quoted price), more when rival bids are refused for lack of
  capacity, never above the limit. A reserved order is placed over its start window's first
  hours as the GPUs are held now (a later lease may free some). Spot parts pay their posted
  part price. The `reason` says so even when fillable.
- **private pools**: admitted by quota, not priced: not quoted (fillable false, the reason
  says why).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from billing import services as money
from billing.core.money import to_dollars
from ibex.accounts.models import Organization
from market import orders
from market.models import Lease, Order
from market.parts import FoundParts

ESTIMATE = ("an estimate: {tier} orders are filled at the next clearing, every winner at one "
            "uniform price, at least the highest reserve price among these GPUs (quoted), more "
            "if rival bids are refused for lack of capacity, never above your limit; the GPUs "
            "may differ")
RESERVED_NOTE = "; capacity is counted over your start window's first hours as held now"
PARTS_ESTIMATE = ("an estimate: spot parts are filled at the next clearing, after the whole-GPU "
                  "bids, at their posted part price; the GPUs may differ")
POOL_REASON = ("private-pool orders are admitted by quota, in queue order, not priced: a quote "
               "covers the public market (see the pool's queue instead)")


@dataclass(frozen=True)
class Quote:
    fillable: bool
    tier: str
    gpus: int
    hours: int
    price_micros: int | None = None
    locality: dict | None = None
    placement: list[dict] = field(default_factory=list)
    reason: str = ""

    @property
    def total_micros(self) -> int | None:
        """price × GPUs (or parts) × hours."""
        return None if self.price_micros is None else self.price_micros * self.gpus * self.hours

    def to_json(self) -> dict:
        return {
            "fillable": self.fillable, "tier": self.tier, "gpus": self.gpus,
            "price_per_gpu_hour": (None if self.price_micros is None
                                   else to_dollars(self.price_micros)),
            "total": None if self.total_micros is None else to_dollars(self.total_micros),
            "locality": self.locality, "placement": self.placement, "reason": self.reason,
        }


def quote_order(*, tenant: Organization, request: orders.OrderRequest,
                now: datetime | None = None) -> Quote:
    """What `request` would get if placed now; refuses bad input as place_order does
    (OrderError naming the field). Writes nothing."""
    if request.pool:
        orders.work_of(request)  # the same refusals for what it asks its nodes
        return Quote(fillable=False, tier=request.tier, gpus=request.gpus,
                     hours=request.hours, reason=POOL_REASON)
    work = orders.check_public_request(request)
    order = orders.build_order(tenant=tenant, request=request, work=work)
    with transaction.atomic():
        try:
            return _quote(tenant, request, order, now or timezone.now())
        finally:
            transaction.set_rollback(True)


def _quote(tenant: Organization, request: orders.OrderRequest, order: Order,
           now: datetime) -> Quote:
    size_checked_late = request.tier == Lease.Tier.ON_DEMAND and not request.is_parts
    cost = orders.max_cost_micros(request)
    if cost > 0:
        try:  # rolled back with the rest
            money.hold_for_order(tenant=tenant, order_ref=f"quote-{uuid.uuid4().hex}",
                                 amount_micros=cost, actor="quote")
        except money.MoneyError as exc:
            if size_checked_late:
                orders.check_size(request)  # bad input is named before a money refusal
            return _refused(request, exc.message)
    start = now
    if request.tier == Lease.Tier.RESERVED and request.start_earliest is not None:
        start = max(now, request.start_earliest)
    found = orders.find_gpus(order, start, start + timedelta(hours=request.hours))
    if isinstance(found, str):
        if size_checked_late:
            orders.check_size(request)  # the order's 400 for an order no fabric can hold
        return _refused(request, found)
    return _fillable(request, found)


def _refused(request: orders.OrderRequest, reason: str) -> Quote:
    return Quote(fillable=False, tier=request.tier, gpus=request.gpus, hours=request.hours,
                 reason=reason)


def _fillable(request: orders.OrderRequest, found) -> Quote:
    limit = request.max_price_micros
    if isinstance(found, FoundParts):
        placement = [{"node": found.key.host, "index": p.index,
                      **({"mig_profile": p.mig_profile} if p.mig_profile
                         else {"share": p.span[1] - p.span[0]})}
                     for p in found.parts]
        price = found.price_micros(limit)
        reason = "" if request.tier == Lease.Tier.ON_DEMAND else PARTS_ESTIMATE
    else:
        placement = sorted(({"node": key.host, "index": gpu.index} for key, gpu in found.chosen),
                           key=lambda p: (p["node"], p["index"]))
        if request.tier == Lease.Tier.ON_DEMAND:
            price, reason = found.price_micros(limit), ""
        else:  # the uniform price the clearing would at least ask
            price = min(max(gpu.price_micros for _, gpu in found.chosen), limit)
            reason = ESTIMATE.format(tier=request.tier)
            if request.tier == Lease.Tier.RESERVED:
                reason += RESERVED_NOTE
    return Quote(fillable=True, tier=request.tier, gpus=request.gpus, hours=request.hours,
                 price_micros=price, locality=found.locality(), placement=placement,
                 reason=reason)

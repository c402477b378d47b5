"""Per-GPU prices: a provider prices one GPU or many at once (a node, a model, a leaf, a
fabric). Each change supersedes the GPU's current price and is kept as history."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from ibex.accounts.models import Organization
from ibex.db import analyze_after_bulk_load
from ibex.errors import Refusal
from market.models import GpuPrice
from pool.models import Gpu
from pool.services import mark_shareable, offered_gpus

SCOPE_KEYS = ("fabric", "gpu_model", "node", "leaf", "gpu")


class PriceError(Refusal):
    """A price that cannot be set; `field` names the input at fault."""


@dataclass(frozen=True)
class PriceChange:
    gpus_priced: int
    price_micros: int


def gpus_for_sale(*, now: datetime | None = None,
                  window: tuple[datetime, datetime] | None = None) -> QuerySet[Gpu]:
    """What the public market sells: offered GPUs in no private pool with a current price
    (with `window`, a price whose offer covers all of it). (A private pool's GPUs serve its
    own queues and are never for sale.)"""
    current = Q(prices__isnull=False, prices__superseded_at__isnull=True)
    if window is not None:
        start, end = window
        current &= (Q(prices__offered_from__isnull=True) | Q(prices__offered_from__lte=start)) & (
            Q(prices__offered_until__isnull=True) | Q(prices__offered_until__gte=end))
    # one filter() call: every condition on `prices` holds for the same (current) row
    return offered_gpus(now=now).exclude(node__pools__kind="private").filter(current)


def gpus_in_scope(*, provider: Organization, scope: dict) -> QuerySet[Gpu]:
    """The provider's GPUs a scope names; every key narrows it (all must match)."""
    unknown = set(scope) - set(SCOPE_KEYS)
    if unknown:
        raise PriceError("Unknown scope key.", field=f"scope.{sorted(unknown)[0]}")
    if not scope:
        raise PriceError(f"Name at least one of {', '.join(SCOPE_KEYS)}.", field="scope")
    gpus = Gpu.objects.filter(node__provider=provider).exclude(node__state="retired")
    if "fabric" in scope:
        gpus = gpus.filter(node__fabric__name=scope["fabric"])
    if "gpu_model" in scope:
        gpus = gpus.filter(gpu_model__name=scope["gpu_model"])
    if "node" in scope:
        node = str(scope["node"])
        gpus = gpus.filter(node__id=int(node)) if node.isdigit() else gpus.filter(
            node__hostname=node)
    if "leaf" in scope:
        gpus = gpus.filter(node__host__leaf=scope["leaf"])
    if "gpu" in scope:
        gpus = gpus.filter(pk=scope["gpu"])
    return gpus


@transaction.atomic
def set_prices(*, provider: Organization, scope: dict, price_micros: int, actor: str,
               offered_from: datetime | None = None, offered_until: datetime | None = None,
               min_lease_hours: int = 1, shareable: bool | None = None,
               slice_prices: dict[str, int] | None = None) -> PriceChange:
    """Price the GPUs of a scope; `shareable` (None: unchanged) says whether they also sell
    parts, and `slice_prices` (MIG profile → micro-dollars per slice-hour) prices slices
    otherwise priced by their share of compute (market.core.parts)."""
    if price_micros <= 0:
        raise PriceError("A price must be above zero.", field="price_per_gpu_hour")
    if offered_from and offered_until and offered_until <= offered_from:
        raise PriceError("The window must end after it starts.", field="offered_until")
    slice_prices = slice_prices or {}
    # Lock the GPUs in a fixed order so that two price changes over one GPU serialise.
    in_scope = gpus_in_scope(provider=provider, scope=scope)
    gpu_ids = list(in_scope.order_by("pk").select_for_update().values_list("pk", flat=True))
    if not gpu_ids:
        raise PriceError("No GPU of yours matches this scope.", field="scope")
    _check_slice_prices(slice_prices, in_scope)
    if shareable is not None:
        mark_shareable(gpu_ids=gpu_ids, shareable=shareable)
    now = timezone.now()
    GpuPrice.objects.filter(gpu_id__in=gpu_ids, superseded_at__isnull=True).update(
        superseded_at=now)
    GpuPrice.objects.bulk_create([
        GpuPrice(gpu_id=gpu_id, price_micros=price_micros, offered_from=offered_from,
                 offered_until=offered_until, min_lease_hours=min_lease_hours, set_by=actor,
                 slice_prices=slice_prices)
        for gpu_id in gpu_ids
    ], batch_size=5000)
    analyze_after_bulk_load(GpuPrice, rows=len(gpu_ids))
    return PriceChange(gpus_priced=len(gpu_ids), price_micros=price_micros)


def _check_slice_prices(slice_prices: dict[str, int], gpus: QuerySet[Gpu]) -> None:
    profiles = {name for names in gpus.filter(gpu_model__mig_capable=True)
                .values_list("gpu_model__mig_profiles", flat=True).distinct() for name in names}
    for name, micros in slice_prices.items():
        field = f"price_per_slice_hour.{name}"
        if name not in profiles:
            known = ", ".join(sorted(profiles)) or "none: no MIG-capable GPU in this scope"
            raise PriceError(f"{name!r} is not a MIG profile of these GPUs ({known}).",
                             field=field)
        if micros <= 0:
            raise PriceError("A price must be above zero.", field=field)


def current_prices(gpu_ids) -> dict[int, int]:
    """GPU id → its current price in micro-dollars per hour (unpriced GPUs are absent)."""
    return dict(GpuPrice.objects.filter(gpu_id__in=list(gpu_ids), superseded_at__isnull=True)
                .values_list("gpu_id", "price_micros"))

"""Public market data (docs/api-market-data.md): the order book of a market's next clearing and
its candles, each one aggregate query in PostgreSQL, whatever the number of bids or clearings.
The ranges, the empty intervals and the order of rows are `market.core.candles`'.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import BigIntegerField, Count, F, Func, Max, Min, Q, Sum, TextField, Value
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Trunc

from market.auctions import AUCTION_TIERS, interval_start
from market.core.candles import Candle, CandleRange, fill_candles, sorted_book
from market.models import Clearing, Lease, Order
from market.order_states import OS

TRUNC_KIND = {"1h": "hour", "1d": "day"}

# GPU-hours one clearing sold: each accepted whole-GPU bid's GPUs times its order's hours
# (parts, marked `parts`, are sold at posted prices and are not in `gpus_sold` either).
GPU_HOURS_SQL = """(
SELECT COALESCE(SUM((won.value ->> 'gpus')::bigint * o.hours), 0)
  FROM jsonb_array_elements("market_clearing"."accepted") AS won
  JOIN "market_order" o ON o.id = (won.value ->> 'order')::bigint
 WHERE NOT (won.value ? 'parts'))"""


class _First(Func):
    """The first element of an array (PostgreSQL arrays count from 1); NULL when empty."""

    template = "(%(expressions)s)[1]"
    output_field = BigIntegerField()


def _first_price(*, latest: bool) -> _First:
    """The price of the interval's first (or last) clearing that had one."""
    order = "-interval_start" if latest else "interval_start"
    return _First(ArrayAgg("price_micros", order_by=order,
                           filter=Q(price_micros__isnull=False)))


def next_clearing(*, gpu_model: str, now: datetime) -> datetime:
    """The interval whose clearing takes the resting bids next: this one, unless this
    interval's clearing of the market is done."""
    step = settings.AUCTION_INTERVAL_S
    start = interval_start(now, step)
    if Clearing.objects.filter(gpu_model=gpu_model, interval_start=start).exists():
        start += timedelta(seconds=step)
    return start


def book_rows(*, gpu_model: str, now: datetime) -> list[dict]:
    """The whole-GPU spot and reserved bids the market's next clearing takes (resting, naming
    the model, a reserved one not past its start window), summed per limit per GPU-hour and
    required topology level: `price_micros`, `topology`, `bids`, `gpus`, `gpu_hours`. Nothing
    that names a bidder leaves this function."""
    rows = (Order.objects
            .filter(state=OS.RESTING, tier__in=AUCTION_TIERS, gpu_models__contains=[gpu_model],
                    mig_profile="", gpu_share__isnull=True)
            .exclude(tier=Lease.Tier.RESERVED, start_latest__lt=now)
            .annotate(level=Coalesce(KT("topology__required"), Value("none"),
                                     output_field=TextField()))
            .values("max_price_micros", "level")
            .annotate(bid_count=Count("id"), gpu_sum=Sum("gpus"),
                      gpu_hour_sum=Sum(F("gpus") * F("hours")))
            .order_by())
    return sorted_book({"price_micros": row["max_price_micros"], "topology": row["level"],
                        "bids": row["bid_count"], "gpus": row["gpu_sum"],
                        "gpu_hours": row["gpu_hour_sum"]} for row in rows)


def candles(*, gpu_model: str, rng: CandleRange) -> list[Candle]:
    """Per interval of the range, in time order: open, high, low and close of the market's
    clearing prices, its clearings, GPUs and GPU-hours sold; empty intervals included."""
    rows = (Clearing.objects
            .filter(gpu_model=gpu_model, interval_start__gte=rng.start,
                    interval_start__lt=rng.end)
            .annotate(bucket=Trunc("interval_start", TRUNC_KIND[rng.interval], tzinfo=UTC))
            .values("bucket")
            .annotate(open=_first_price(latest=False), close=_first_price(latest=True),
                      high=Max("price_micros"), low=Min("price_micros"), clearings=Count("id"),
                      gpus_sold=Sum("gpus_sold"),
                      gpu_hours_sold=Sum(RawSQL(GPU_HOURS_SQL, (),
                                                output_field=BigIntegerField())))
            .order_by())
    found = {row["bucket"]: Candle(
        start=row["bucket"], end=row["bucket"] + rng.step, open=row["open"], high=row["high"],
        low=row["low"], close=row["close"], clearings=row["clearings"],
        gpus_sold=row["gpus_sold"] or 0, gpu_hours_sold=row["gpu_hours_sold"] or 0)
        for row in rows}
    return fill_candles(rng, found)

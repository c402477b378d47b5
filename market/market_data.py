"""Public market data (docs/api-market-data.md): the order book of a market's next clearing (two
aggregate queries: bids of one shape, shapes of bids over alternatives) and its candles (one),
whatever the number of bids or clearings.
The ranges, the empty intervals and the order of rows are `market.core.candles`'.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import connection
from django.db.models import BigIntegerField, Count, F, Func, Max, Min, Q, Sum, TextField, Value
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce, Trunc

from market.auctions import AUCTION_TIERS, interval_start
from market.core.candles import Candle, CandleRange, fill_candles, merged_book, sorted_book
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


BOOK_FIELDS = ("price_micros", "topology", "bids", "gpus", "gpu_hours")
# The shapes of resting bids over alternatives that name the market, summed like the bids of
# one shape (a bid counts once per price and level, however many of its shapes lie there).
ALTERNATIVES_SQL = """
SELECT (shape.value ->> 'max_price_micros')::bigint,
       COALESCE(shape.value -> 'topology' ->> 'required', 'none'),
       COUNT(DISTINCT o.id),
       SUM((shape.value ->> 'gpus')::bigint),
       SUM((shape.value ->> 'gpus')::bigint * (shape.value ->> 'hours')::bigint)
  FROM "market_order" o
 CROSS JOIN LATERAL jsonb_array_elements(o.alternatives) AS shape
 WHERE o.state = %s AND o.tier = ANY(%s) AND o.alternatives <> '[]'::jsonb
   AND shape.value -> 'gpu_models' ? %s
   AND NOT (o.tier = %s AND o.start_latest IS NOT NULL AND o.start_latest < %s)
 GROUP BY 1, 2"""


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
    required topology level: `price_micros`, `topology`, `bids`, `gpus`, `gpu_hours`. A bid
    over alternatives is there with each of its shapes that names the market (at most one of
    them wins). Nothing that names a bidder leaves this function."""
    one_shape = (Order.objects
                 .filter(state=OS.RESTING, tier__in=AUCTION_TIERS, alternatives=[],
                         gpu_models__contains=[gpu_model], mig_profile="",
                         gpu_share__isnull=True)
                 .exclude(tier=Lease.Tier.RESERVED, start_latest__lt=now)
                 .annotate(level=Coalesce(KT("topology__required"), Value("none"),
                                          output_field=TextField()))
                 .values("max_price_micros", "level")
                 .annotate(bid_count=Count("id"), gpu_sum=Sum("gpus"),
                           gpu_hour_sum=Sum(F("gpus") * F("hours")))
                 .order_by())
    rows = [{"price_micros": row["max_price_micros"], "topology": row["level"],
             "bids": row["bid_count"], "gpus": row["gpu_sum"],
             "gpu_hours": row["gpu_hour_sum"]} for row in one_shape]
    with connection.cursor() as cursor:
        cursor.execute(ALTERNATIVES_SQL, [OS.RESTING, list(AUCTION_TIERS), gpu_model,
                                          Lease.Tier.RESERVED, now])
        rows += [dict(zip(BOOK_FIELDS, row, strict=True)) for row in cursor.fetchall()]
    return sorted_book(merged_book(rows))


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

"""The public market: per GPU model, posted prices, free GPUs and the last clearing; a
market's page with its candles, the depth of its book and its clearings."""

from django.http import Http404
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from billing.core.money import to_micros
from market import market_data
from market.api import market_summaries, market_summary
from market.core.candles import INTERVALS, candle_range
from market.models import Clearing
from pool.models import GpuModel
from web.charts import candle_chart, depth_chart, depth_levels

HISTORY_ROWS = 200
DEPTH_PRICES = 50  # the book's highest prices drawn and listed


def _cards() -> list[dict]:
    cards = []
    models = list(GpuModel.objects.order_by("name"))
    for model, summary in zip(models, market_summaries([m.name for m in models]), strict=True):
        offered, free = summary["offered_gpus"], summary["free_gpus"]
        cards.append({
            **summary, "model": model,
            "free_percent": round(100 * free / offered) if offered else 0,
            "low": _micros(summary["on_demand_min"]), "high": _micros(summary["on_demand_max"]),
            "last_price": _micros((summary["last_clearing"] or {}).get("price_per_gpu_hour")),
        })
    # markets with GPUs on offer first, then by name
    return sorted(cards, key=lambda c: (c["offered_gpus"] == 0, c["gpu_model"]))


def _micros(dollars: str | None) -> int | None:
    return None if dollars is None else to_micros(dollars)


@require_GET
def market(request):
    return render(request, "web/market.html", {"cards": _cards()})


@require_GET
def market_cards(request):
    """The cards alone: htmx swaps them in every few seconds."""
    return render(request, "web/partials/market_cards.html", {"cards": _cards()})


@require_GET
def history(request, gpu_model: str):
    """A market: candles of its clearing prices (hours of the last day, or `?interval=1d`
    days of the last 30), the depth of its next clearing's book, its latest clearings."""
    model = GpuModel.objects.filter(name=gpu_model).first()
    if model is None:
        raise Http404(f"No market for {gpu_model}.")
    now = timezone.now()
    interval = request.GET.get("interval")
    rng = candle_range(interval=interval if interval in INTERVALS else None, start=None,
                       end=None, now=now)
    candles = market_data.candles(gpu_model=gpu_model, rng=rng)
    book = market_data.book_rows(gpu_model=gpu_model, now=now)
    depth = depth_levels(book)[:DEPTH_PRICES]
    clearings = list(Clearing.objects.filter(gpu_model=gpu_model)
                     .order_by("-interval_start")[:HISTORY_ROWS])
    return render(request, "web/history.html", {
        "model": model, "summary": market_summary(gpu_model), "clearings": clearings,
        "interval": rng.interval, "intervals": list(INTERVALS), "candles": candles,
        "candle_chart": candle_chart(candles, rng.interval), "depth": depth,
        "depth_chart": depth_chart(depth),
        "next_clearing": market_data.next_clearing(gpu_model=gpu_model, now=now),
    })

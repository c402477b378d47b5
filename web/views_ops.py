"""The operations console's dashboard: pool utilisation over time, fragmentation, auctions,
SLA credits, Celery queues and workers. The Django admin (/admin/) holds the actions."""

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from web import operations
from web.charts import percent_line
from web.orgs import operator_required


def _health() -> dict:
    from ibex.health import beat_age_s

    return {"queues": operations.queue_depths(), "workers": operations.workers(),
            "outbox": operations.outbox_backlog(), "webhooks": operations.webhook_backlog(),
            "beat_age_s": beat_age_s()}


@require_GET
@operator_required
def dashboard(request):
    now = timezone.now()
    day_ago = now - timedelta(hours=24)
    samples = operations.utilisation(hours=24, now=now)
    fabrics = operations.fragmentation_now(now)
    return render(request, "web/ops.html", {
        "samples": samples, "now_sample": samples[-1] if samples else None,
        "chart": percent_line([(s.at, s.percent) for s in samples], label=" of GPUs leased"),
        "peak": max(samples, key=lambda s: s.percent) if samples else None,
        "fabrics": fabrics,
        "totals": {"free_gpus": sum(f.free_gpus for f in fabrics),
                   "whole_free_nodes": sum(f.whole_free_nodes for f in fabrics),
                   "whole_free_leaves": sum(f.whole_free_leaves for f in fabrics)},
        "auctions": operations.auctions_since(day_ago),
        "clearings": operations.recent_clearings(),
        "sla": operations.sla_since(now - timedelta(days=7)),
        **_health(),
    })


@require_GET
@operator_required
def health(request):
    """The queues-and-workers card, refreshed by htmx every few seconds."""
    return render(request, "web/partials/ops_health.html", _health())

"""The provider's pages: onboarding, fleet, a picture of each fabric with what is leased now and
its links' health per tier, bulk pricing, and earnings and payouts."""

from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Max, Min, Q, Sum
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from billing import invoices
from billing.models import ConnectAccount, Payout, UsageRecord
from billing.services import balances_of
from fabric import services as fabric_services
from fabric.models import Fabric
from fabric.selectors import fabric_health, node_domains
from ibex.accounts.models import ProviderProfile
from market import prices
from market.models import Allocation
from pool.models import Gpu, Node
from web.fabric_picture import NodeState, layout
from web.forms import FabricImportForm, PriceForm
from web.orgs import provider_required
from web.templatetags.web_tags import dollars


def _leased_now(provider) -> dict[int, dict[int, tuple[str, int]]]:
    """node id → lease id → (tenant slug, GPUs of this node in it), for leases running now."""
    rows = (Allocation.objects.filter(gpu__node__provider=provider,
                                      period__contains=timezone.now())
            .values_list("gpu__node_id", "lease_id", "lease__tenant__slug"))
    leased: dict[int, dict[int, list]] = defaultdict(dict)
    for node_id, lease_id, tenant in rows:
        tenant_, count = leased[node_id].get(lease_id, (tenant, 0))
        leased[node_id][lease_id] = (tenant_, count + 1)
    return leased


def _fleet(provider):
    nodes = list(
        Node.objects.filter(provider=provider).exclude(state=Node.State.RETIRED)
        .select_related("fabric", "host", "gpu_model").order_by("fabric__name", "hostname")
        # distinct: the join with the GPUs' price history repeats each GPU
        .annotate(gpu_total=Count("gpus", distinct=True),
                  gpu_ok=Count("gpus", distinct=True, filter=Q(gpus__health=Gpu.Health.OK)),
                  gpu_degraded=Count("gpus", distinct=True,
                                     filter=Q(gpus__health=Gpu.Health.DEGRADED)),
                  gpu_failed=Count("gpus", distinct=True,
                                   filter=Q(gpus__health=Gpu.Health.FAILED)),
                  gpu_unknown=Count("gpus", distinct=True,
                                    filter=Q(gpus__health=Gpu.Health.UNKNOWN)),
                  price_low=Min("gpus__prices__price_micros",
                                filter=Q(gpus__prices__superseded_at__isnull=True)),
                  price_high=Max("gpus__prices__price_micros",
                                 filter=Q(gpus__prices__superseded_at__isnull=True))))
    leased = _leased_now(provider)
    for node in nodes:
        node.leases_now = leased.get(node.pk, {})
        node.gpus_leased = sum(count for _, count in node.leases_now.values())
    return nodes


def _pictures(provider, nodes) -> list[dict]:
    by_fabric = defaultdict(list)
    for node in nodes:
        by_fabric[node.fabric_id].append(node)
    pictures = []
    for fabric in Fabric.objects.filter(Q(owner=provider) | Q(pk__in=list(by_fabric))).distinct():
        states = {}
        for node in by_fabric.get(fabric.pk, []):
            leases = "; ".join(f"lease {lid} ({tenant}, {count} GPUs)"
                               for lid, (tenant, count) in sorted(node.leases_now.items()))
            states[node.host.name] = NodeState(
                gpus=node.gpu_total, leased=node.gpus_leased,
                available=node.state == Node.State.ACTIVE
                and node.health == Node.Health.REACHABLE,
                title=f"{node.hostname}: {node.gpus_leased}/{node.gpu_total} GPUs leased"
                      f" · {node.state}, {node.health}" + (f" — {leases}" if leases else ""))
        spines, width, height = layout(node_domains(fabric), states)
        fills = Counter(mark.fill for spine in spines for leaf in spine.children
                        for mark in leaf.children)
        pictures.append({"fabric": fabric, "spines": spines, "width": width, "height": height,
                         "fills": fills,
                         "health": fabric_health(fabric) if fabric.owner_id == provider.id
                         else None})
    return pictures


def _page(request, form, status=200, fabric_form=None):
    provider = request.organization
    nodes = _fleet(provider)
    profile = ProviderProfile.objects.filter(organization=provider).first()
    totals = {"nodes": len(nodes), "gpus": sum(n.gpu_total for n in nodes),
              "leased": sum(n.gpus_leased for n in nodes),
              "unhealthy": sum(n.gpu_degraded + n.gpu_failed for n in nodes)}
    return render(request, "web/provider.html", {
        "org": provider, "profile": profile, "nodes": nodes, "totals": totals,
        "pictures": _pictures(provider, nodes), "form": form,
        "fabric_form": fabric_form or FabricImportForm()}, status=status)


@provider_required
def fleet(request):
    fabric = Fabric.objects.filter(owner=request.organization).order_by("name").first()
    return _page(request, PriceForm(initial={"scope_kind": "fabric",
                                              "scope_value": fabric.name if fabric else ""}))


@require_POST
@provider_required
def set_price(request):
    form = PriceForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            change = prices.set_prices(
                provider=request.organization, scope={data["scope_kind"]: data["scope_value"]},
                price_micros=data["price"], min_lease_hours=data["min_lease_hours"],
                actor=request.user.get_username())
        except prices.PriceError as exc:
            field = {"price_per_gpu_hour": "price", "offered_until": None}.get(
                exc.field, "scope_value")
            form.add_error(field, exc.message)
        else:
            messages.success(request, f"{change.gpus_priced} GPUs now cost "
                                      f"{dollars(change.price_micros)} per GPU-hour.")
            return redirect("web:provider")
    return _page(request, form, status=400)


@require_POST
@provider_required
def import_fabric(request):
    form = FabricImportForm(request.POST, request.FILES)
    if form.is_valid():
        text, path = form.cleaned_data["file"]
        try:
            result = fabric_services.import_fabric_file(
                owner=request.organization, name=form.cleaned_data["name"], text=text,
                fmt=form.cleaned_data["format"], path=path,
                gpus_per_node=form.cleaned_data["gpus_per_node"])
        except fabric_services.FabricImportError as exc:
            form.add_error("file", str(exc))  # the parser's message names the line
        else:
            verb = "imported" if result.created else "updated"
            messages.success(request, f"Fabric {result.fabric.name} {verb}: "
                                      f"{result.fabric.hosts.count()} hosts. Register your "
                                      f"nodes on it next (POST /api/v1/nodes/bulk/).")
            return redirect("web:provider")
    fabric = Fabric.objects.filter(owner=request.organization).order_by("name").first()
    return _page(request, PriceForm(initial={"scope_kind": "fabric",
                                              "scope_value": fabric.name if fabric else ""}),
                 status=400, fabric_form=form)


@require_GET
@provider_required
def fabric_health_part(request, fabric_id: int):
    """The fabric's links down, error rates and utilisation per tier, live: the fleet page's
    health block, fetched again every few seconds (htmx); the page itself shows it without."""
    fabric = get_object_or_404(Fabric, pk=fabric_id, owner=request.organization)
    return render(request, "web/partials/fabric_health.html",
                  {"fabric": fabric, "health": fabric_health(fabric)})


PAYOUTS_PER_PAGE = 20
MONTHS_SHOWN = 12


@require_GET
@provider_required
def earnings(request):
    """Earnings by month (from the usage billed to tenants), fees and hold-back, the payable
    balance, payouts with their state, and a statement to download per month."""
    provider = request.organization
    since = timezone.now() - timedelta(days=7)
    week = UsageRecord.objects.filter(payee=provider, minute__gte=since).aggregate(
        earned=Sum("charge_micros"), fees=Sum("fee_micros"), held_back=Sum("held_back_micros"))
    statements = [invoices.statement_for(provider=provider, month=invoices.parse_month(month))
                  for month in invoices.months_with_activity(organization=provider)[:MONTHS_SHOWN]]
    payouts = Paginator(Payout.objects.filter(provider=provider).order_by("-created_at", "-id"),
                        PAYOUTS_PER_PAGE).get_page(request.GET.get("page"))
    return render(request, "web/earnings.html", {
        "org": provider, "balances": balances_of(provider),
        "week_net": (week["earned"] or 0) - (week["fees"] or 0) - (week["held_back"] or 0),
        "week": week, "statements": statements, "payouts": payouts,
        "connect": ConnectAccount.objects.filter(organization=provider).first(),
        "minimum": settings.PAYOUT_MINIMUM_MICROS})

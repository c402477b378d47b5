"""The tenant's pages: balance, the order form, orders and leases, API keys."""

import uuid

from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from billing.services import balances_of
from fabric.core import qos
from fabric.core.locality import Locality
from ibex import ratelimit
from ibex.accounts import services as accounts
from ibex.accounts.models import ApiKey
from market import orders
from market.leasing import (
    ENDED,
    allocation_key,
    allocations_in_force_with_places,
)
from market.models import Lease, Order
from pool.services import offered_gpus
from web.forms import ApiKeyForm, OrderForm
from web.orgs import member_required, tenant_required

ROWS = 25


def _activity(org, query=None) -> dict:
    """Leases and orders, newest first, `ROWS` a page (`?leases=N`, `?orders=N`)."""
    query = query or {}
    leases = Paginator(
        Lease.objects.filter(tenant=org).order_by("-created_at", "-id")
        .prefetch_related(Prefetch("allocations", queryset=allocations_in_force_with_places(),
                                   to_attr="in_force")),
        ROWS).get_page(query.get("leases"))
    return {
        "orders": Paginator(Order.objects.filter(tenant=org).order_by("-created_at", "-id"),
                            ROWS).get_page(query.get("orders")),
        "lease_page": leases,
        "leases": [{"lease": lease, "ended": lease.state in ENDED,
                    "gpus": gpu_list(lease.in_force),
                    "locality": Locality.of(map(allocation_key, lease.in_force)).to_json()}
                   for lease in leases],
        "balances": balances_of(org),
    }


def gpu_list(allocations) -> list[str]:
    """Allocations → ["node-01/0-7", "node-02/0-3,6"]: each node once, its GPU indexes as
    ranges; a part of a GPU as "node-01/3 · 1g.10gb" or "node-01/3 · share 250/1000"."""
    by_node: dict[str, list[int]] = {}
    listed = []
    for a in allocations:
        if a.part == "mig":  # a part: each on its own line, saying which part
            listed.append(f"{a.gpu.node.hostname}/{a.gpu.index} · {a.mig_profile}")
        elif a.part == "share":
            listed.append(f"{a.gpu.node.hostname}/{a.gpu.index} · share "
                          f"{a.span.upper - a.span.lower}/1000")
        else:
            by_node.setdefault(a.gpu.node.hostname, []).append(a.gpu.index)
    for node, indexes in by_node.items():
        runs: list[list[int]] = []
        for index in sorted(indexes):
            if runs and index == runs[-1][1] + 1:
                runs[-1][1] = index
            else:
                runs.append([index, index])
        listed.append(f"{node}/" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs))
    return listed


def _default_model() -> str | None:
    """The model with the most GPUs on offer, for the order form's first choice."""
    top = (offered_gpus().order_by().values("gpu_model__name").annotate(n=Count("id"))
           .order_by("-n", "gpu_model__name").first())
    return top["gpu_model__name"] if top else None


def _place(request, form: OrderForm):
    data = form.cleaned_data
    common = dict(
        tier=data["tier"], start_earliest=data.get("start_earliest"),
        start_latest=data.get("start_latest"), fill=data["fill"],
        idempotency_key=data.get("idempotency_key") or "", allow_moves=data["allow_moves"],
        mig_profile=data.get("mig_profile") or "", gpu_share=data.get("gpu_share"),
        bandwidth_class=data.get("bandwidth_class") or qos.STANDARD,
        gbps_per_gpu=data.get("gbps_per_gpu"))
    if alternatives := form.filled_alternatives():
        request_ = orders.over_alternatives(alternatives=[row.shape() for row in alternatives],
                                            **common)
    else:
        request_ = orders.OrderRequest(
            gpu_models=[data["gpu_model"].name], gpus=data["gpus"], hours=data["hours"],
            max_price_micros=data["max_price"], topology=form.topology(), **common)
    return orders.place_order(tenant=request.organization, request=request_,
                              actor=request.user.get_username())


@tenant_required
def dashboard(request):
    org = request.organization
    if request.method == "POST" and not ratelimit.allowed("orders", f"org-{org.pk}"):
        form = OrderForm(request.POST)
        form.errors.clear()
        form.add_error(None, "Too many orders in the last minute. Wait a moment and try again.")
        return render(request, "web/dashboard.html", {
            "org": org, "form": form, "last_order": None, **_activity(org, request.GET)},
            status=429)
    if request.method == "POST":
        form = OrderForm(request.POST)
        if form.is_valid():
            try:
                order = _place(request, form)
            except orders.OrderError as exc:
                form.add_order_error(exc.field, exc.message)
            else:
                request.session["last_order"] = order.pk
                return redirect("web:dashboard")
    else:
        form = OrderForm(initial={"idempotency_key": uuid.uuid4().hex,
                                  "gpu_model": _default_model(),
                                  "allow_moves": orders.allows_moves(orders.OrderRequest(
                                      gpu_models=[], gpus=0, hours=0, max_price_micros=0,
                                      tier=OrderForm.base_fields["tier"].initial))})
    last = None
    if request.method == "GET" and (last_id := request.session.pop("last_order", None)):
        last = Order.objects.filter(tenant=org, pk=last_id).select_related("lease").first()
    return render(request, "web/dashboard.html", {
        "org": org, "form": form, "last_order": last, **_activity(org, request.GET)},
        status=400 if form.errors else 200)


def _activity_response(request):
    return render(request, "web/partials/activity.html",
                  {"org": request.organization,
                   **_activity(request.organization, request.GET)})


@require_GET
@tenant_required
def activity(request):
    return _activity_response(request)


@member_required
def api_keys(request):
    org = request.organization
    issued = None
    form = ApiKeyForm(request.POST or None)
    if request.method == "POST" and not ratelimit.allowed("keys", f"org-{org.pk}"):
        form.add_error(None, "Too many keys created recently. Try again later.")
        return render(request, "web/api_keys.html", {
            "org": org, "form": form, "issued": None,
            "keys": ApiKey.objects.filter(organization=org).order_by("-created_at")}, status=429)
    if request.method == "POST" and form.is_valid():
        issued = accounts.issue_api_key(organization=org, scopes=form.cleaned_data["scopes"],
                                        name=form.cleaned_data["name"], user=request.user)
        form = ApiKeyForm()
    keys = ApiKey.objects.filter(organization=org).order_by("-created_at")
    return render(request, "web/api_keys.html", {"org": org, "form": form, "issued": issued,
                                                 "keys": keys})


@require_POST
@member_required
def revoke_key(request, key_id: int):
    key = get_object_or_404(ApiKey, pk=key_id, organization=request.organization)
    accounts.revoke_api_key(api_key=key)
    messages.success(request, f"Key {key.prefix}… revoked.")
    return redirect("web:api-keys")

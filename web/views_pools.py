"""Private pools and their quotas: an organisation sees its quotas per GPU model, what it
uses, borrows and lends, its waiting orders (queue position and why each waits), its leases
in the pool, and orders in quota; operators see the whole pool: the quota tree, usage per
node, every waiting order and the tidal schedule with its last runs."""

import uuid
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from market import orders
from market.models import Order
from market.pool_orders import pool_leases
from pool import quotas
from pool.models import Pool, QuotaNode, TidalStep
from web.forms import POOL_ORDER_FIELDS, PoolOrderForm
from web.orgs import is_operator, organization_for

LEASE_ROWS = 50
TIDAL_RUNS = 5


def pool_viewer_required(view):
    """Members of an organisation, and operators (who may belong to none)."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        request.organization = organization_for(request.user)
        request.is_operator = is_operator(request.user)
        if request.organization is None and not request.is_operator:
            return render(request, "web/forbidden.html",
                          {"role": "member of an organisation"}, status=403)
        return view(request, *args, **kwargs)
    return wrapper


def _visible_pools(request):
    if request.is_operator:
        return Pool.objects.filter(kind=Pool.Kind.PRIVATE)
    return quotas.pools_visible_to(request.organization).filter(kind=Pool.Kind.PRIVATE)


def _pool_or_404(request, name: str) -> Pool:
    pool = _visible_pools(request).filter(name=name).select_related("owner").first()
    if pool is None:
        raise Http404("no such pool")
    return pool


def _queues_of(org, pool: Pool | None = None):
    """The organisation's quota queues (leaves), with their quotas."""
    if org is None:
        return QuotaNode.objects.none()
    found = QuotaNode.objects.filter(organization=org, children__isnull=True,
                                     pool__kind=Pool.Kind.PRIVATE)
    if pool is not None:
        found = found.filter(pool=pool)
    return found.select_related("pool").prefetch_related("quotas__gpu_model").order_by("name")


def _tree(rows: list[dict]) -> list[dict]:
    """Quota rows as the nested tree: each cohort's roots, each followed by its descendants,
    every row with its depth (0 = a root)."""
    children: dict[str | None, list[dict]] = {}
    for row in rows:
        children.setdefault(row["parent"], []).append(row)

    def walk(row, depth, into):
        into.append({**row, "depth": min(depth, 4)})
        for child in children.get(row["name"], []):
            walk(child, depth + 1, into)

    cohorts: dict[str, list[dict]] = {}
    for root in children.get(None, []):
        cohorts.setdefault(root["cohort"], []).append(root)
    groups = []
    for cohort in sorted(cohorts):
        nested: list[dict] = []
        for root in cohorts[cohort]:
            walk(root, 0, nested)
        groups.append({"cohort": cohort, "rows": nested})
    return groups


def _live(pool: Pool, org, operator: bool) -> dict:
    """The parts of a pool's page that change: quotas and usage, waiting orders, leases."""
    rows = quotas.quota_view(pool, viewer=None if operator else org)
    for row in rows:
        for q in row["quotas"]:  # the usage meter: tenths of the nominal, 10 when over
            q["tenths"] = (min(10, q["used"] * 10 // q["nominal"]) if q["nominal"]
                           else 10 if q["used"] else 0)
    mine = [r for r in rows if org is not None and r["organization"] == org.slug]
    waiting = (Order.objects.filter(pool=pool, state=Order.State.QUEUED)
               .select_related("quota_node", "tenant")
               .order_by("queue_position", "created_at", "pk"))
    leases = pool_leases(pool).select_related("tenant").order_by("-pk")
    if not operator:
        waiting, leases = waiting.filter(tenant=org), leases.filter(tenant=org)
    return {"pool": pool, "org": org, "operator": operator, "mine": mine,
            "groups": _tree(rows) if operator else [],
            "waiting": list(waiting), "leases": list(leases[:LEASE_ROWS]),
            "capacity": quotas.pool_capacity(pool)}


def _tidal(pool: Pool) -> list[dict]:
    return [{"step": step, "runs": list(step.runs.all()[:TIDAL_RUNS])}
            for step in TidalStep.objects.filter(pool=pool).order_by("daily_at", "at", "name")]


@require_GET
@pool_viewer_required
def pools(request):
    org = request.organization
    mine = {}
    for queue in _queues_of(org):
        mine.setdefault(queue.pool_id, []).append(queue.name)
    listed = [{"pool": pool, "queues": mine.get(pool.pk, []),
               "capacity": quotas.pool_capacity(pool)}
              for pool in _visible_pools(request).select_related("owner").order_by("name")]
    return render(request, "web/pools.html", {"org": org, "pools": listed,
                                              "operator": request.is_operator})


def _place(request, form: PoolOrderForm) -> Order:
    data = form.cleaned_data
    return orders.place_order(
        tenant=request.organization, actor=request.user.get_username(),
        request=orders.OrderRequest(
            gpu_models=[data["gpu_model"]], gpus=data["gpus"], hours=data["hours"],
            tier="on_demand", max_price_micros=0, pool=data["pool"], queue=data["queue"],
            priority=0 if data["priority_class"] else data["priority"],
            priority_class=data["priority_class"],
            idempotency_key=data.get("idempotency_key") or ""))


@pool_viewer_required
def pool_detail(request, name: str):
    pool = _pool_or_404(request, name)
    org = request.organization
    queues = list(_queues_of(org))
    form = None
    if queues and request.method == "POST":
        form = PoolOrderForm(request.POST, queues=queues)
        if form.is_valid():
            try:
                order = _place(request, form)
            except orders.OrderError as exc:
                form.add_error(POOL_ORDER_FIELDS.get(exc.field), exc.message)
            else:
                request.session["last_pool_order"] = order.pk
                return redirect("web:pool", name=pool.name)
    elif request.method == "POST":
        return render(request, "web/forbidden.html",
                      {"role": "organisation with quota in this pool"}, status=403)
    elif queues:
        here = [q for q in queues if q.pool_id == pool.pk] or queues
        form = PoolOrderForm(queues=queues, initial={
            "idempotency_key": uuid.uuid4().hex, "pool": here[0].pool.name,
            "queue": here[0].name})
    last = None
    if request.method == "GET" and (last_id := request.session.pop("last_pool_order", None)):
        last = Order.objects.filter(tenant=org, pk=last_id).first()
    return render(request, "web/pool.html", {
        **_live(pool, org, request.is_operator), "form": form, "last_order": last,
        "tidal": _tidal(pool) if request.is_operator else []},
        status=400 if form is not None and form.errors else 200)


@require_GET
@pool_viewer_required
def pool_live(request, name: str):
    """The live part of a pool's page, refreshed by htmx every few seconds."""
    return _live_response(request, _pool_or_404(request, name))


def _live_response(request, pool: Pool):
    return render(request, "web/partials/pool_live.html",
                  _live(pool, request.organization, request.is_operator))


@require_POST
@pool_viewer_required
def cancel_waiting(request, name: str, order_id: int):
    """Cancel one of the organisation's waiting orders in this pool (htmx: answers the live
    part)."""
    pool = _pool_or_404(request, name)
    order = get_object_or_404(Order, pk=order_id, pool=pool, tenant=request.organization)
    try:
        orders.cancel_order(order=order, actor=request.user.get_username())
    except orders.OrderError as exc:
        messages.error(request, f"Order {order.pk} not cancelled: {exc.message}.")
    else:
        messages.success(request, f"Order {order.pk} cancelled.")
    if request.headers.get("HX-Request"):
        return _live_response(request, pool)
    return redirect("web:pool", name=pool.name)

"""One lease of the tenant's: its GPUs, history, SLA, the preemption countdown, terminate and
extend, what its nodes run (each rank's state, the SSH lines, a live tail of each rank's
output); and cancelling a resting order from the dashboard."""

import shlex

from django.contrib import messages
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from fabric import selectors as fabric_selectors
from fabric.core.locality import Locality
from market import leasing, orders, parts
from market.leasing import ENDED, allocation_key, allocations_in_force_with_places
from market.models import Lease, Order
from pool import workloads as pool_workloads
from scheduler.sla import sla_report
from web.orgs import tenant_required
from web.views_tenant import _activity_response, gpu_list

MAX_EXTEND_HOURS = 24 * 30
# a page of a rank's output shown at once; the tail fetches the rest page by page
LOG_PAGE_BYTES = 256 * 1024


def countdown(seconds: float) -> str:
    """Seconds left → "4 min 05 s" (or "now")."""
    seconds = int(seconds)
    if seconds <= 0:
        return "now"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    return f"{minutes} min {secs:02d} s"


def _sla(lease: Lease) -> dict:
    report = sla_report(lease)
    bp = report["sla"].availability_target_bp
    return {**report, "target": None if bp is None else f"{bp / 100:g}%"}


def _lease_context(lease: Lease) -> dict:
    now = timezone.now()
    allocations = list(allocations_in_force_with_places().filter(lease=lease))
    context = {"lease": lease, "ended": lease.state in ENDED, "gpus": _gpus(lease, allocations),
               "locality": Locality.of(map(allocation_key, allocations)).to_json(),
               "events": lease.events.all(), "sla": _sla(lease), "now": now,
               "delivered": fabric_selectors.delivered_bandwidth([lease.reference]).get(
                   lease.reference),
               "max_extend_hours": MAX_EXTEND_HOURS}
    if lease.state == Lease.State.PREEMPTING and lease.preempt_at:
        left = (lease.preempt_at - now).total_seconds()
        context["preempt_in"] = countdown(left)
    return {**context, **_workload_context(lease)}


def _gpus(lease: Lease, allocations: list) -> list[str]:
    """The GPUs as `node/0-7`; a lease of parts part by part, with what its node made of it
    (`node/3 · 1g.10gb · MIG-…`, `node/3 · share 250/1000 · not enforced: why`)."""
    if not lease.mig_profile and lease.gpu_share is None:
        return gpu_list(allocations)
    bindings = pool_workloads.bindings_by_lease([lease.reference])[lease.reference]
    listed = []
    for part in pool_workloads.parts_view(parts.part_rows(allocations), bindings):
        line = f"{part['node']}/{part['index']} · " + (
            part.get("mig_profile") or f"share {part['share']}/1000")
        if part["enforced"] is False:
            line += f" · not enforced: {part['error']}"
        elif part["device"]:
            line += f" · {part['device']}"
        listed.append(line)
    return listed


def _workload_context(lease: Lease) -> dict:
    """What the lease's nodes run (None without a command), each rank's state, and per node the
    SSH line (only when the lease brought keys)."""
    bindings = pool_workloads.bindings_by_lease([lease.reference])[lease.reference]
    workload = pool_workloads.workload_view(bindings, lease.workload)
    if workload is not None:
        workload["command_line"] = shlex.join(str(arg) for arg in workload["command"])
        workload["env_line"] = " ".join(f"{name}={shlex.quote(str(value))}"
                                        for name, value in sorted(workload["env"].items()))
    access = (pool_workloads.access_view(bindings, lease.reference, True)
              if lease.ssh_keys else [])
    slurm = [a for a in pool_workloads.access_view(bindings, lease.reference, False,
                                                   lease.slurm_account) if a["slurm"]]
    return {"workload": workload, "access": access, "ssh_wanted": bool(lease.ssh_keys),
            "slurm": slurm}


def _lease_of(request, lease_id: int) -> Lease:
    return get_object_or_404(Lease, pk=lease_id, tenant=request.organization)


@tenant_required
def lease_detail(request, lease_id: int):
    lease = _lease_of(request, lease_id)
    context = {"org": request.organization, **_lease_context(lease)}
    if request.headers.get("HX-Request"):
        return render(request, "web/partials/lease.html", context)
    if context["workload"] is not None:
        context["log"] = {"live": lease.state not in ENDED, **_log_panel(
            lease, context["workload"]["nodes"], _node_rank(request.GET.get("rank")))}
    return render(request, "web/lease.html", context)


def _node_rank(value: str | None) -> int:
    if value in (None, ""):
        return 0
    if not value.isdigit() or int(value) > 10_000:
        raise Http404("no such rank")
    return int(value)


@tenant_required
def lease_log(request, lease_id: int):
    """A rank's output. With `since` (the tail polling): the lines after that cursor, to append
    to the page's <pre>, and the next poll while the lease runs or lines remain. Without: the
    output panel for that rank (its tabs, the lines so far)."""
    lease = _lease_of(request, lease_id)
    node_rank = _node_rank(request.GET.get("node_rank"))
    since = request.GET.get("since")
    context = {"lease": lease, "node_rank": node_rank,
               "live": lease.state not in ENDED}
    if since is not None:
        try:
            page = pool_workloads.read_log(lease_ref=lease.reference, node_rank=node_rank,
                                           since=since, limit_bytes=LOG_PAGE_BYTES)
        except (pool_workloads.NoSuchRank, pool_workloads.BadCursor) as exc:
            raise Http404(str(exc)) from None
        return render(request, "web/partials/log_lines.html", {**context, "page": page})
    workload = _workload_context(lease)["workload"]
    if workload is None:
        raise Http404("the lease runs no command")
    return render(request, "web/partials/lease_log.html",
                  {**context, **_log_panel(lease, workload["nodes"], node_rank)})


def _log_panel(lease: Lease, ranks: list[dict], node_rank: int) -> dict:
    """The output panel of one rank: the ranks to choose from and the rank's first page (None
    before the lease has ranks)."""
    if not ranks:
        return {"ranks": ranks, "node_rank": 0, "page": None}
    if not any(rank["node_rank"] == node_rank for rank in ranks):
        node_rank = 0
    try:
        page = pool_workloads.read_log(lease_ref=lease.reference, node_rank=node_rank,
                                       since=None, limit_bytes=LOG_PAGE_BYTES)
    except pool_workloads.NoSuchRank:
        page = None
    return {"ranks": ranks, "node_rank": node_rank, "page": page}


def _after_action(request, lease: Lease):
    """htmx from the lease page: the lease again; htmx from the dashboard: its tables;
    a plain form: back to the page it came from."""
    from_lease_page = (request.headers.get("HX-Target") == "lease"
                       or request.POST.get("next") == "lease")
    if request.headers.get("HX-Request"):
        if from_lease_page:
            lease.refresh_from_db()
            return render(request, "web/partials/lease.html",
                          {"org": request.organization, **_lease_context(lease)})
        return _activity_response(request)
    return redirect("web:lease", lease.pk) if from_lease_page else redirect("web:dashboard")


@require_POST
@tenant_required
def extend(request, lease_id: int):
    lease = _lease_of(request, lease_id)
    try:
        hours = int(request.POST.get("hours", ""))
        if not 1 <= hours <= MAX_EXTEND_HOURS:
            raise ValueError
    except ValueError:
        messages.error(request, f"Lease {lease.pk}: extend by a whole number of hours, "
                                f"1 to {MAX_EXTEND_HOURS}.")
        return _after_action(request, lease)
    try:
        lease = leasing.extend_lease(lease=lease, hours=hours,
                                     actor=request.user.get_username())
    except (leasing.LeaseTransitionError, leasing.GpusUnavailable,
            leasing.ExtensionRefused) as exc:
        messages.error(request, f"Lease {lease.pk} not extended: {exc}.")
    else:
        messages.success(request, f"Lease {lease.pk} extended by {hours} h; it now ends "
                                  f"{timezone.localtime(lease.ends_at):%b %-d %Y, %H:%M}.")
    return _after_action(request, lease)


@require_POST
@tenant_required
def terminate(request, lease_id: int):
    lease = _lease_of(request, lease_id)
    try:
        leasing.terminate_lease(lease=lease, actor=request.user.get_username())
    except leasing.LeaseTransitionError as exc:
        messages.error(request, f"Lease {lease.pk}: {exc}.")
    else:
        messages.success(request, f"Lease {lease.pk} terminated.")
    return _after_action(request, lease)


@require_POST
@tenant_required
def cancel_order(request, order_id: int):
    order = get_object_or_404(Order, pk=order_id, tenant=request.organization)
    try:
        orders.cancel_order(order=order, actor=request.user.get_username())
    except orders.OrderError as exc:
        messages.error(request, f"Order {order.pk} not cancelled: {exc.message}.")
    else:
        messages.success(request, f"Order {order.pk} cancelled; its hold is released.")
    if request.headers.get("HX-Request"):
        return _activity_response(request)
    return redirect("web:dashboard")

"""Quotas in the database: define quota nodes and their per-model quotas, build the pure
`pool.core.quotas.QuotaTree` of a pool, and read what the API shows (capacity, quotas when idle).

Every change to quotas goes through `define_quota_node` and `set_quota` (one transaction
each). Per-queue usage comes from the market's active leases: the market passes it as plain
`(queue, model, gpus)` tuples to `usage_of_pool` (the pool imports nothing from the market).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q

from ibex.accounts.models import Organization
from ibex.audit.services import record_audit
from ibex.errors import Refusal
from pool.core import quotas as core
from pool.models import Binding, Gpu, GpuModel, Node, Pool, PriorityClass, Quota, QuotaNode


class QuotaInputError(Refusal):
    """Input a quota cannot be built from; `field` names what is wrong."""


@dataclass(frozen=True)
class QuotaSpec:
    gpu_model: str
    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


# --- selectors --------------------------------------------------------------------------------


def pools_visible_to(org: Organization):
    """Operators see every pool; others the pools they own or whose quota nodes name them."""
    pools = Pool.objects.all()
    if org.is_operator:
        return pools
    return pools.filter(Q(owner=org) | Q(quota_nodes__organization=org)).distinct()


def _core_node(row: QuotaNode, quotas: Iterable[Quota]) -> core.QuotaNode:
    return core.QuotaNode(
        name=row.name,
        parent=row.parent.name if row.parent_id else None,
        cohort=row.cohort or None,
        quotas={q.gpu_model.name: core.ModelQuota(q.nominal, q.borrowing_limit, q.lending_limit)
                for q in quotas},
        preempt_within_queue=row.preempt_within_queue)


def quota_nodes_of(pool: Pool):
    return (QuotaNode.objects.filter(pool=pool).select_related("parent", "organization")
            .prefetch_related("quotas__gpu_model").order_by("name"))


def quota_tree(pool: Pool) -> core.QuotaTree:
    """The pure quota tree of a pool, from its rows."""
    return core.QuotaTree(_core_node(row, row.quotas.all()) for row in quota_nodes_of(pool))


def usage_of_pool(pool: Pool, leases: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, int]]:
    """Usage (queue → model → GPUs) from plain `(queue, model, gpus)` of the pool's active
    leases, as the market passes them; queues not in the pool's tree are left out."""
    names = set(QuotaNode.objects.filter(pool=pool).values_list("name", flat=True))
    return core.usage_of(core.RunningLease(id=str(i), queue=q, model=m, gpus=g)
                         for i, (q, m, g) in enumerate(leases) if q in names)


def available_if_idle(tree: core.QuotaTree, name: str, model: str) -> int:
    """What `available_to` answers for a node while nothing runs."""
    return core.available_to(tree, name, model, {})


def pool_capacity(pool: Pool) -> list[dict]:
    """Per GPU model: GPUs on the pool's live nodes, and how many are bound to leases now."""
    gpus: dict[str, int] = {}
    for name in (Gpu.objects.filter(node__pools=pool).exclude(node__state=Node.State.RETIRED)
                 .values_list("gpu_model__name", flat=True)):
        gpus[name] = gpus.get(name, 0) + 1
    bound: dict[str, int] = {}
    for name, indexes in (Binding.objects.filter(node__pools=pool, serve=True,
                                                 stopped_at__isnull=True)
                          .values_list("node__gpu_model__name", "gpu_indexes")):
        bound[name] = bound.get(name, 0) + (len(indexes) if isinstance(indexes, list) else 0)
    return [{"gpu_model": m, "gpus": gpus.get(m, 0), "bound": bound.get(m, 0)}
            for m in sorted(set(gpus) | set(bound))]


# --- services -------------------------------------------------------------------------------


def _check_numbers(spec: QuotaSpec, where: str) -> None:
    for name in ("nominal", "borrowing_limit", "lending_limit"):
        value = getattr(spec, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise QuotaInputError(f"{name} must be a non-negative whole number", field=where + name)
    if spec.lending_limit is not None and spec.lending_limit > spec.nominal:
        raise QuotaInputError(f"lending_limit {spec.lending_limit} is above nominal {spec.nominal}", field=where + "lending_limit")


def _check_tree(pool: Pool, replaced: core.QuotaNode) -> None:
    rows = [_core_node(r, r.quotas.all()) for r in quota_nodes_of(pool) if r.name != replaced.name]
    try:
        core.QuotaTree([*rows, replaced])
    except core.QuotaError as exc:
        field = "cohort" if replaced.cohort else "parent"
        raise QuotaInputError(str(exc), field=field) from None


@transaction.atomic
def define_quota_node(*, pool: Pool, name: str, parent: str | None = None, cohort: str = "",
                      organization: Organization | None = None,
                      preempt_within_queue: bool = False, shape_nodes: int | None = None,
                      quotas: Iterable[QuotaSpec] = ()) -> QuotaNode:
    """Create or replace the quota node `name` of `pool` with exactly these quotas."""
    quotas = list(quotas)
    Pool.objects.select_for_update().filter(pk=pool.pk).first()  # one tree change at a time
    if parent and cohort:
        raise QuotaInputError("a quota node names a parent or a cohort, not both", field="cohort")
    parent_row = None
    if parent:
        parent_row = QuotaNode.objects.filter(pool=pool, name=parent).first()
        if parent_row is None:
            raise QuotaInputError(f"pool {pool.name} has no quota node {parent!r}", field="parent")
    models = {m.name: m for m in GpuModel.objects.filter(name__in=[q.gpu_model for q in quotas])}
    seen = set()
    for position, spec in enumerate(quotas):
        where = f"quotas.{position}."
        if spec.gpu_model not in models:
            raise QuotaInputError(f"unknown GPU model {spec.gpu_model!r}", field=where + "gpu_model")
        if spec.gpu_model in seen:
            raise QuotaInputError(f"{spec.gpu_model} is named twice", field=where + "gpu_model")
        seen.add(spec.gpu_model)
        _check_numbers(spec, where)
    _check_tree(pool, core.QuotaNode(
        name=name, parent=parent or None, cohort=cohort or None,
        quotas={q.gpu_model: core.ModelQuota(q.nominal, q.borrowing_limit, q.lending_limit)
                for q in quotas}))
    node, _ = QuotaNode.objects.update_or_create(
        pool=pool, name=name,
        defaults={"parent": parent_row, "cohort": cohort or "", "organization": organization,
                  "preempt_within_queue": preempt_within_queue, "shape_nodes": shape_nodes})
    node.quotas.all().delete()
    Quota.objects.bulk_create(
        Quota(node=node, gpu_model=models[q.gpu_model], nominal=q.nominal,
              borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit) for q in quotas)
    record_audit(action="quota.define", target=node, organization=organization,
                 details={"pool": pool.name, "name": name, "parent": parent, "cohort": cohort,
                          "quotas": [dataclasses.asdict(q) for q in quotas]})
    return node


@transaction.atomic
def set_quota(*, node: QuotaNode, gpu_model: str, nominal: int,
              borrowing_limit: int | None = None, lending_limit: int | None = None) -> Quota:
    """Create or change one node's quota of one GPU model."""
    spec = QuotaSpec(gpu_model, nominal, borrowing_limit, lending_limit)
    model = GpuModel.objects.filter(name=gpu_model).first()
    if model is None:
        raise QuotaInputError(f"unknown GPU model {gpu_model!r}", field="gpu_model")
    _check_numbers(spec, "")
    quota, _ = Quota.objects.update_or_create(
        node=node, gpu_model=model,
        defaults={"nominal": nominal, "borrowing_limit": borrowing_limit,
                  "lending_limit": lending_limit})
    record_audit(action="quota.set", target=quota, details={
        "node": node.name, "gpu_model": gpu_model, "nominal": nominal,
        "borrowing_limit": borrowing_limit, "lending_limit": lending_limit})
    return quota


@transaction.atomic
def define_priority_class(*, pool: Pool, name: str, value: int,
                          description: str = "") -> PriorityClass:
    """Create or change a pool's named priority (orders in its queues may name it)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1000:
        raise QuotaInputError("a priority class's value is a whole number from 0 to "
                                       "1000", field="value")
    found, _ = PriorityClass.objects.update_or_create(
        pool=pool, name=name, defaults={"value": value, "description": description})
    return found


def lent_by(tree: core.QuotaTree, usage, model: str) -> dict[str, int]:
    """An attribution of what each queue lends now: the GPUs borrowed under each root are
    charged to the idle, lendable nominal of the root's queues, in name order."""
    out: dict[str, int] = {}
    roots: dict[str, list[str]] = {}
    for queue in tree.queues():
        roots.setdefault(tree.root(queue), []).append(queue)
    for queues in roots.values():
        left = sum(core.borrowed(tree, q, model, usage) for q in queues)
        for queue in sorted(queues):
            q = tree.node(queue).quota(model)
            if q is None:
                continue
            idle = max(0, q.nominal - int(usage.get(queue, {}).get(model, 0)))
            if q.lending_limit is not None:
                idle = min(idle, q.lending_limit)
            out[queue] = min(idle, left)
            left -= out[queue]
    return out


def quota_view(pool: Pool, viewer: Organization | None = None) -> list[dict]:
    """Each quota node of a pool with its quotas, what each would get while all is idle, and
    now: used, borrowed, lent and available; queues list their queued orders (position and
    reason) to operators and to the organisation that owns the queue."""
    from pool.usage_port import usage_and_waiting

    rows = list(quota_nodes_of(pool))
    tree = core.QuotaTree(_core_node(r, r.quotas.all()) for r in rows)
    live = usage_and_waiting(pool)
    usage = usage_of_pool(pool, live["usage"])
    lent = {m: lent_by(tree, usage, m) for m in tree.models()}

    def may_see(row) -> bool:
        return viewer is None or viewer.is_operator or row.organization_id == viewer.pk

    return [{
        "id": r.id, "pool": pool.name, "name": r.name,
        "parent": r.parent.name if r.parent_id else None, "cohort": r.cohort,
        "organization": r.organization.slug if r.organization_id else None,
        "preempt_within_queue": r.preempt_within_queue, "shape_nodes": r.shape_nodes,
        "is_queue": tree.is_queue(r.name),
        "quotas": [{"gpu_model": q.gpu_model.name, "nominal": q.nominal,
                    "borrowing_limit": q.borrowing_limit, "lending_limit": q.lending_limit,
                    "available_if_idle": available_if_idle(tree, r.name, q.gpu_model.name),
                    "used": tree.total_used(r.name, q.gpu_model.name, usage),
                    "borrowed": (core.borrowed(tree, r.name, q.gpu_model.name, usage)
                                 if tree.is_queue(r.name) else 0),
                    "lent": lent.get(q.gpu_model.name, {}).get(r.name, 0),
                    "available_now": core.available_to(tree, r.name, q.gpu_model.name, usage)}
                   for q in r.quotas.all()],
        "waiting": live["waiting"].get(r.name, []) if may_see(r) else [],
    } for r in rows]

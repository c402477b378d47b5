"""Orders: taking a tenant's bid, holding its maximum cost, and matching on-demand orders at
once against the cheapest set of free GPUs that satisfies the topology constraint.

Spot and reserved orders wait for the batch auction (`market.core.clearing`, cleared by a beat
task); an unfilled `rest` order waits and is re-tried when capacity frees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from billing import services as money
from billing.core.money import divide_rounded
from fabric import selectors as fabric_selectors
from fabric.core import qos
from fabric.core.locality import WIDEST_FIRST, Locality, NodeKey
from ibex.accounts.models import Organization
from ibex.db import lock_until_commit, retry_on_deadlock
from ibex.outbox import services as outbox
from market import guarantees, leasing, parts, pool_orders
from market.core import clearing, workloads
from market.models import Lease, Order, OrderEvent
from market.order_states import (
    OS,
    OrderError,
    change_order_state,
    order_ref,
    release_order_hold,
)
from pool.core.workloads import runtimes_field, runtimes_for
from pool.models import Gpu, GpuModel
from pool.services import offered_gpus

PLACEMENT_RETRIES = 3


@dataclass(frozen=True)
class OrderRequest:
    gpu_models: list[str]
    gpus: int
    hours: int
    tier: str
    max_price_micros: int
    topology: dict = field(default_factory=dict)
    start_earliest: datetime | None = None
    start_latest: datetime | None = None
    fill: str = Order.Fill.FILL_OR_KILL
    idempotency_key: str = ""
    pool: str = ""  # a private pool: priced in quota (market.pool_orders)
    queue: str = ""
    priority: int = 0
    priority_class: str = ""  # a private pool's named priority (pool.PriorityClass)
    allow_moves: bool | None = None  # None: spot leases may be moved, others not
    workload: dict | None = None  # what the lease's nodes run (market.core.workloads)
    ssh_keys: list = field(default_factory=list)  # OpenSSH public keys let into its nodes
    slurm_account: str = ""  # the Slurm account its reservations on Slurm nodes are made for
    mig_profile: str = ""  # parts of GPUs: `gpus` slices of this MIG profile ...
    gpu_share: int | None = None  # ... or `gpus` shares of this many thousandths (market.parts)
    # an auction bid over 2-8 shapes ({gpu_models, gpus, hours, max_price_micros, topology}),
    # of which at most one wins; the shape fields above are then the first of them
    alternatives: list = field(default_factory=list)
    bandwidth_class: str = qos.STANDARD  # its traffic class on the fabric (fabric.core.qos)
    gbps_per_gpu: Decimal | None = None  # guaranteed: reserved per GPU on its routes

    @property
    def is_parts(self) -> bool:
        return bool(self.mig_profile) or self.gpu_share is not None


def allows_moves(request: OrderRequest) -> bool:
    """The tenant's consent to planned moves; by default a spot lease consents (it is
    interruptible anyway) and an on-demand or reserved one does not."""
    if request.allow_moves is not None:
        return request.allow_moves
    return request.tier == Lease.Tier.SPOT


def own_shape(order: Order | OrderRequest) -> dict:
    """An order's (or a request's) shape fields, as an alternative gives them."""
    return {"gpu_models": order.gpu_models, "gpus": order.gpus, "hours": order.hours,
            "max_price_micros": order.max_price_micros, "topology": order.topology or {}}


def shapes_of(order: Order | OrderRequest) -> list[dict]:
    """Its alternatives, or its one shape."""
    return order.alternatives or [own_shape(order)]


def max_cost_micros(request: OrderRequest) -> int:
    """The most the order can cost: for a bid over alternatives, its dearest shape."""
    return max(shape["gpus"] * shape["hours"] * shape["max_price_micros"]
               for shape in shapes_of(request))


MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 8


def over_alternatives(*, alternatives: list[dict], **fields) -> OrderRequest:
    """A bid over alternatives ({gpu_models, gpus, hours, max_price_micros, topology} each):
    its shape fields are the first alternative's until one wins."""
    first = alternatives[0]
    return OrderRequest(gpu_models=list(first["gpu_models"]), gpus=first["gpus"],
                        hours=first["hours"], max_price_micros=first["max_price_micros"],
                        topology=dict(first.get("topology") or {}),
                        alternatives=alternatives, **fields)


def _check_alternatives(request: OrderRequest) -> None:
    """A bid over alternatives is a public auction bid of 2 to 8 whole-GPU shapes (the API
    says so before this; the web form leans on it), each of which names a market and fits
    in a fabric."""
    count = len(request.alternatives)
    if not MIN_ALTERNATIVES <= count <= MAX_ALTERNATIVES:
        raise OrderError(f"Give {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} alternatives "
                         f"({count} given).", field="alternatives")
    if request.tier not in (Lease.Tier.SPOT, Lease.Tier.RESERVED):
        raise OrderError("Alternatives are for auction bids (spot or reserved): on demand "
                         "takes one shape.", field="tier")
    if request.pool or request.is_parts:
        raise OrderError("Alternatives are bids for whole GPUs in the public market's "
                         "auctions.", field="pool" if request.pool else "mig_profile")
    for position, shape in enumerate(request.alternatives):
        where = f"alternatives.{position}"
        known = set(GpuModel.objects.filter(name__in=shape["gpu_models"])
                    .values_list("name", flat=True))
        unknown = [m for m in shape["gpu_models"] if m not in known]
        if unknown:
            raise OrderError(f"no market for GPU model {unknown[0]!r}",
                             field=f"{where}.gpu_models")
        try:
            check_size(OrderRequest(gpu_models=shape["gpu_models"], gpus=shape["gpus"],
                                    hours=shape["hours"], tier=request.tier,
                                    max_price_micros=shape["max_price_micros"]))
        except OrderError as exc:
            raise OrderError(exc.message, field=f"{where}.gpus") from None


def _check_models(request: OrderRequest) -> None:
    known = set(GpuModel.objects.filter(name__in=request.gpu_models).values_list("name",
                                                                                 flat=True))
    unknown = [m for m in request.gpu_models if m not in known]
    if unknown:
        raise OrderError(f"unknown GPU model {unknown[0]!r}", field="gpu_models")


def check_size(request: OrderRequest) -> None:
    per_fabric = (Gpu.objects.filter(gpu_model__name__in=request.gpu_models)
                  .exclude(node__state="retired").order_by().values("node__fabric")
                  .annotate(gpus=Count("id")).order_by("-gpus").first())
    largest = per_fabric["gpus"] if per_fabric else 0
    if request.gpus > largest:
        raise OrderError(f"no fabric has {request.gpus} GPUs of these models "
                         f"(the largest has {largest})", field="gpus")


def _check_window(request: OrderRequest, now: datetime) -> None:
    """A start window must not have passed and must start within the market's horizon
    (MARKET_HORIZON_DAYS, the operator's)."""
    if request.start_latest is None:
        return
    if request.start_latest <= now:
        raise OrderError(f"the start window ended at {request.start_latest:%Y-%m-%d %H:%M} "
                         f"UTC, in the past", field="start_window")
    horizon = now + timedelta(days=settings.MARKET_HORIZON_DAYS)
    if request.start_earliest is not None and request.start_earliest > horizon:
        raise OrderError(f"the start window must begin within {settings.MARKET_HORIZON_DAYS} "
                         f"days (by {horizon:%Y-%m-%d %H:%M} UTC)", field="start_window")


@dataclass(frozen=True)
class Work:
    """What an order asks its lease's nodes for, checked, as the order and its lease keep it."""

    workload: dict | None
    ssh_keys: list[str]
    slurm_account: str

    def runtimes(self) -> frozenset[str] | None:
        return runtimes_for(self.workload, self.ssh_keys, self.slurm_account)


def work_of(request: OrderRequest) -> Work:
    """The order's workload, SSH keys and Slurm account as a lease keeps them, or the input at
    fault."""
    try:
        workload = workloads.parse_workload(request.workload)
        return Work(workload=workload.as_json() if workload else None,
                    ssh_keys=workloads.parse_ssh_keys(request.ssh_keys),
                    slurm_account=workloads.parse_slurm_account(request.slurm_account))
    except workloads.InvalidWorkload as exc:
        raise OrderError(exc.message, field=exc.field) from None


def _check(request: OrderRequest) -> None:
    if request.alternatives:
        _check_alternatives(request)
        _check_window(request, timezone.now())
        return
    _check_models(request)
    if request.is_parts:
        _check_parts(request)
    else:
        check_size(request)
    _check_window(request, timezone.now())


def _check_bandwidth(request: OrderRequest) -> None:
    """A known class; a guarantee with `guaranteed` only, for whole GPUs, no faster than the
    fastest link of any fabric."""
    if request.bandwidth_class not in qos.CLASSES:
        raise OrderError(f"unknown bandwidth class {request.bandwidth_class!r}: one of "
                         f"{', '.join(qos.CLASSES)}", field="bandwidth.class")
    if request.bandwidth_class != qos.GUARANTEED:
        if request.gbps_per_gpu is not None:
            raise OrderError("gbps_per_gpu goes with the guaranteed class only.",
                             field="bandwidth.gbps_per_gpu")
        return
    if request.is_parts:
        raise OrderError("Parts of GPUs share one node and its links: they take the standard "
                         "or scavenger class.", field="bandwidth.class")
    if request.gbps_per_gpu is None or request.gbps_per_gpu <= 0:
        raise OrderError("A guaranteed class needs gbps_per_gpu above 0.",
                         field="bandwidth.gbps_per_gpu")
    fastest = fabric_selectors.fastest_link_gbps()
    if fastest is None or request.gbps_per_gpu > fastest:
        raise OrderError(f"{request.gbps_per_gpu} Gb/s per GPU is above the fastest link of "
                         f"any fabric ({fastest or 0} Gb/s)", field="bandwidth.gbps_per_gpu")


def _check_parts(request: OrderRequest) -> None:
    """Parts of GPUs are sold on demand or spot, on one node, in the public market, and a MIG
    profile only by models that have it."""
    if request.mig_profile and request.gpu_share is not None:
        raise OrderError("Give mig_profile or gpu_share, not both.", field="mig_profile")
    if request.gpu_share is not None and not 1 <= request.gpu_share <= 999:
        raise OrderError("A share is 1 to 999 thousandths of a GPU.", field="gpu_share")
    if request.tier not in (Lease.Tier.ON_DEMAND, Lease.Tier.SPOT):
        raise OrderError("Parts of GPUs (mig_profile, gpu_share) are sold on demand or spot, "
                         "not reserved.", field="tier")
    if request.pool:
        raise OrderError("Private pools lend whole GPUs: parts of GPUs are sold in the public "
                         "market.", field="pool")
    topology = request.topology or {}
    if topology.get("whole_nodes") or any(
            topology.get(kind) not in (None, "node") for kind in ("required", "preferred")):
        raise OrderError("Parts of GPUs are never multi-node: all of an order's parts are on "
                         "one node.", field="topology")
    if request.mig_profile and not parts.models_selling(request.mig_profile,
                                                        request.gpu_models):
        raise OrderError(f"none of {', '.join(request.gpu_models)} has the MIG profile "
                         f"{request.mig_profile!r}", field="mig_profile")


def check_public_request(request: OrderRequest) -> Work:
    """What a public-market order is refused for before anything is looked up or written
    (its workload, its parts, its models; the size and window unless it is a whole-GPU
    on-demand order, whose size is checked only when it is not filled: `check_size`). The
    order path and quotes (market.quotes) refuse the same input the same way."""
    work = work_of(request)
    if request.is_parts:
        _check_parts(request)
    _check_bandwidth(request)
    if request.tier != Lease.Tier.ON_DEMAND or request.is_parts or request.alternatives:
        _check(request)
    else:
        _check_models(request)
    return work


@retry_on_deadlock
def place_order(*, tenant: Organization, request: OrderRequest, actor: str) -> Order:
    """Take an order: idempotent per Idempotency-Key; holds its maximum cost or refuses it."""
    if request.idempotency_key:
        existing = Order.objects.filter(tenant=tenant,
                                        idempotency_key=request.idempotency_key).first()
        if existing is not None:
            return existing
    target = None
    if request.pool:
        work = work_of(request)  # refused before anything is looked up or written
        if request.alternatives:
            _check_alternatives(request)  # refused: alternatives are public auction bids
        if request.is_parts:
            _check_parts(request)
        _check_bandwidth(request)
        target = pool_orders.resolve_target(
            tenant=tenant, pool=request.pool, queue=request.queue, gpu_models=request.gpu_models,
            tier=request.tier, max_price_micros=request.max_price_micros, gpus=request.gpus,
            priority=request.priority, priority_class=request.priority_class,
            runtimes=work.runtimes(),
            runtimes_field=runtimes_field(work.workload, work.ssh_keys))
    else:
        work = check_public_request(request)
    # An on-demand order's size is checked only when it is not filled (a filled one fitted in
    # a fabric); the check's error then rolls it all back, so the client sees the same 400
    # and nothing is recorded. An aggregate over every GPU less an order.
    check_unless_filled = (target is None and request.tier == Lease.Tier.ON_DEMAND
                           and not request.is_parts)
    try:
        with transaction.atomic():
            try:
                order = _create_and_hold(tenant, request, actor, work)
            except OrderError:
                if check_unless_filled:
                    check_size(request)  # bad input is named before a money refusal
                raise
            if target is not None:
                pool_orders.queue_order(order=order, target=target, actor=actor)
            elif order.tier == Lease.Tier.ON_DEMAND:
                if match_on_demand(order=order, actor=actor).state != OS.FILLED \
                        and check_unless_filled:
                    check_size(request)
            else:
                change_order_state(order, OS.RESTING, actor=actor, reason="waiting for the next clearing")
    except IntegrityError:
        # a concurrent request with the same Idempotency-Key won the race
        existing = Order.objects.filter(tenant=tenant,
                                        idempotency_key=request.idempotency_key).first()
        if existing is None:
            raise
        return existing
    return order


def build_order(*, tenant: Organization, request: OrderRequest, work: Work) -> Order:
    """The order as it would be saved (unsaved): what place_order writes and a quote
    (market.quotes) matches without writing."""
    return Order(
        tenant=tenant, idempotency_key=request.idempotency_key, gpu_models=request.gpu_models,
        gpus=request.gpus, hours=request.hours, tier=request.tier,
        mig_profile=request.mig_profile, gpu_share=request.gpu_share,
        max_price_micros=request.max_price_micros, topology=request.topology,
        start_earliest=request.start_earliest, start_latest=request.start_latest,
        fill=request.fill, priority=request.priority, allow_moves=allows_moves(request),
        workload=work.workload, ssh_keys=work.ssh_keys, slurm_account=work.slurm_account,
        alternatives=request.alternatives, alternative=None if request.alternatives else 0,
        bandwidth_class=request.bandwidth_class, gbps_per_gpu=request.gbps_per_gpu,
    )


def _create_and_hold(tenant: Organization, request: OrderRequest, actor: str,
                     work: Work) -> Order:
    order = build_order(tenant=tenant, request=request, work=work)
    order.save(force_insert=True)
    OrderEvent.objects.create(order=order, to_state=OS.OPEN, actor=actor, reason="received")
    cost = max_cost_micros(request)
    if cost > 0:
        try:
            money.hold_for_order(tenant=tenant, order_ref=order_ref(order), amount_micros=cost,
                                 actor=actor)
        except money.MoneyError as exc:
            raise OrderError(exc.message, code=exc.code) from None
    return order


# --- on-demand matching -----------------------------------------------------------------------


class FreeGpu(NamedTuple):
    gpu_id: int
    index: int
    price_micros: int


def free_priced_gpus(order: Order, start: datetime, end: datetime,
                     gpu_model_of: dict[str, str] | None = None,
                     runtime_of: dict[str, str] | None = None,
                     any_runtime: bool = False,
                     avoid_nodes: frozenset[int] = frozenset()) -> dict[NodeKey, list[FreeGpu]]:
    """Node → its free priced GPUs, cheapest first: offered, of an
    accepted model, for sale over the whole range and for this many hours, on nodes whose
    runtime can run what the order asks (`pool.core.workloads.runtimes_for`; `any_runtime`:
    on every node). `gpu_model_of` and `runtime_of`, when given, are filled with each node's
    GPU model and runtime (hostname → model, runtime). `avoid_nodes`: node ids left out (a
    scheduler refused to reserve them for this lease).

    One row a node (its GPUs as arrays, sorted by the database): on 2,048 GPUs that is 256
    rows instead of 2,048, which is most of an on-demand order's Python time."""
    window = (Q(prices__offered_from__isnull=True) | Q(prices__offered_from__lte=start)) & (
        Q(prices__offered_until__isnull=True) | Q(prices__offered_until__gte=end))
    cheapest_first = ("prices__price_micros", "index")
    runtimes = None if any_runtime else leasing.runtimes_of(order)
    on_nodes = Q() if runtimes is None else Q(node__runtime__in=sorted(runtimes))
    rows = (
        offered_gpus().exclude(node__pools__kind="private")  # private pools are not sold
        .filter(on_nodes)
        # one filter() call: every condition on `prices` must hold for the same (current) row
        .filter(Q(gpu_model__name__in=order.gpu_models, prices__superseded_at__isnull=True,
                  prices__min_lease_hours__lte=order.hours) & window)
        .exclude(allocations__period__overlap=(start, end))
        .exclude(node_id__in=sorted(avoid_nodes))
        .order_by()
        .values("node_id", "node__fabric__name", "node__host__spine", "node__host__leaf",
                "node__hostname", "gpu_model__name", "node__runtime")
        .annotate(ids=ArrayAgg("id", order_by=cheapest_first),
                  indexes=ArrayAgg("index", order_by=cheapest_first),
                  prices=ArrayAgg("prices__price_micros", order_by=cheapest_first))
        .values_list("node__fabric__name", "node__host__spine", "node__host__leaf",
                     "node__hostname", "gpu_model__name", "node__runtime", "ids", "indexes",
                     "prices")
    )
    by_node: dict[NodeKey, list[FreeGpu]] = {}
    models: dict[str, str] = {}
    node_runtimes: dict[str, str] = {}
    for fabric, spine, leaf, host, model, runtime, ids, indexes, prices in rows:
        by_node[NodeKey(fabric, spine, leaf, host)] = list(map(FreeGpu, ids, indexes, prices))
        models[host] = model
        node_runtimes[host] = runtime
    if gpu_model_of is not None:
        gpu_model_of.update(models)
    if runtime_of is not None:
        runtime_of.update(node_runtimes)
    return by_node


def bid_for(order: Order, shape: dict | None = None) -> clearing.Bid:
    """The order as the clearing takes it; `shape`: one of its alternatives ({gpu_models,
    gpus, hours, max_price_micros, topology}) instead of its own shape."""
    shape = shape or own_shape(order)
    topology = shape["topology"] or {}
    whole = topology.get("whole_nodes")
    return clearing.Bid(
        id=str(order.pk), gpus=shape["gpus"], hours=Decimal(shape["hours"]),
        limit_micros=shape["max_price_micros"], gpu_models=frozenset(shape["gpu_models"]),
        topology=clearing.Topology(required=topology.get("required"),
                                   preferred=topology.get("preferred"),
                                   slice_size=8 if whole else None,
                                   slice_level="node" if whole else None),
        submitted_at=order.created_at,
        runtimes=leasing.runtimes_of(order),
    )


def offers_from(by_node: dict[NodeKey, list[FreeGpu]], gpu_model_of: dict[str, str],
                runtime_of: dict[str, str]) -> list[clearing.NodeOffer]:
    return [
        clearing.NodeOffer(name=key.host, gpu_model=gpu_model_of[key.host], labels=key.labels,
                           reserve_micros=tuple(g.price_micros for g in gpus),
                           runtime=runtime_of[key.host])
        for key, gpus in sorted(by_node.items())
    ]


@dataclass(frozen=True)
class FoundGpus:
    """Where the placement engine put an order: the GPUs chosen (with their node keys)."""

    chosen: list[tuple[NodeKey, FreeGpu]]
    gpu_model: str

    def choices(self) -> list[leasing.GpuChoice]:
        return [leasing.GpuChoice(g.gpu_id, g.price_micros) for _, g in self.chosen]

    def locality(self) -> dict:
        return Locality.of(k for k, _ in self.chosen).to_json()

    def price_micros(self, limit_micros: int) -> int:
        prices = [g.price_micros for _, g in self.chosen]
        return min(divide_rounded(sum(prices), len(prices)), limit_micros)

    def gpus_by_node(self) -> dict[tuple[str, str], list[int]]:
        """(fabric name, node hostname) -> the indexes of the GPUs chosen there."""
        indexes: dict[tuple[str, str], list[int]] = {}
        for key, gpu in self.chosen:
            indexes.setdefault((key.fabric, key.host), []).append(gpu.index)
        return indexes


def find_gpus(order: Order, start: datetime, end: datetime,
              avoid_nodes: frozenset[int] = frozenset()) -> FoundGpus | parts.FoundParts | str:
    """Run the placement engine for `order` on the GPUs free over [start, end) now: the
    cheapest set that satisfies its models, topology and price limit on nodes that can run
    what it asks (and not on `avoid_nodes`), or why there is none. An order for parts of
    GPUs goes to the part placer (market.parts)."""
    if parts.is_parts(order):
        return parts.find_parts(order, start, end, avoid_nodes)
    models: dict[str, str] = {}
    runtimes: dict[str, str] = {}
    by_node = free_priced_gpus(order, start, end, gpu_model_of=models, runtime_of=runtimes,
                               avoid_nodes=avoid_nodes)
    result = clearing.match_on_demand(WIDEST_FIRST, offers_from(by_node, models, runtimes),
                                      [bid_for(order)], parts.placer_with_mix())
    if result.refused:
        return _why_not(order, start, end, result.refused[0].reason)
    chosen = _cheapest_gpus(by_node, result.matched[0].lines)
    found = FoundGpus(chosen=chosen, gpu_model=models[chosen[0][0].host])
    if not guarantees.is_guaranteed(order):
        return found
    candidates = [found, *domain_candidates(order, by_node, models, runtimes)]
    index, verdict = guarantees.choose(order, [c.gpus_by_node() for c in candidates], start, end)
    return candidates[index] if index is not None else guarantees.refusal_text(verdict)


def domain_candidates(order: Order, by_node: dict, models: dict, runtimes: dict):
    """Other placements of a guaranteed order, for admission to choose the one with the most
    headroom: the engine's choice inside each leaf, then each spine, that has the GPUs free
    (`market.guarantees.candidate_domains`)."""
    free = {key: len(gpus) for key, gpus in by_node.items()}
    for keys in guarantees.candidate_domains(free, order.gpus):
        subset = {key: by_node[key] for key in keys}
        result = clearing.match_on_demand(WIDEST_FIRST, offers_from(subset, models, runtimes),
                                          [bid_for(order)], parts.placer_with_mix())
        if result.matched:
            chosen = _cheapest_gpus(subset, result.matched[0].lines)
            yield FoundGpus(chosen=chosen, gpu_model=models[chosen[0][0].host])


def _why_not(order: Order, start: datetime, end: datetime, reason: str) -> str:
    """The refusal's reason; for an order kept off some nodes by their runtime (one asking
    nodes to run something, or naming no Slurm account), matched again over every node's free
    GPUs (the clearing still keeps it off the ones that cannot run it), so that a refusal
    caused by the runtime says so. Only refusals pay for this second look."""
    if leasing.runtimes_of(order) is None:
        return reason
    models: dict[str, str] = {}
    runtimes: dict[str, str] = {}
    by_node = free_priced_gpus(order, start, end, gpu_model_of=models, runtime_of=runtimes,
                               any_runtime=True)
    result = clearing.match_on_demand(WIDEST_FIRST, offers_from(by_node, models, runtimes),
                                      [bid_for(order)], parts.placer_with_mix())
    # matched: GPUs freed between the two looks; the first answer stands
    return result.refused[0].reason if result.refused else reason


def match_on_demand(*, order: Order, actor: str) -> Order:
    """Fill the order now at posted prices, or refuse it / let it rest, saying why.

    On-demand orders for one GPU model are matched one at a time (a lock held to the commit):
    orders arriving together would otherwise all pick the same cheapest GPUs, one would win at
    the exclusion constraint and the others would be refused although GPUs were left. The
    constraint still decides against auctions and moves, which take no such lock: hence the
    retries."""
    lock_until_commit(*(f"market.on_demand.{model}" for model in order.gpu_models))
    for _attempt in range(PLACEMENT_RETRIES):
        start = timezone.now()
        end = start + timedelta(hours=order.hours)
        found = find_gpus(order, start, end)
        if isinstance(found, str):
            return _not_filled(order, found, actor)
        try:
            lease = _lease_for(order, found, start, end, actor)
        except leasing.GpusUnavailable:
            continue  # another order took one of them meanwhile: look again
        order.lease = lease
        change_order_state(order, OS.FILLED, actor=actor, reason=f"filled by lease {lease.pk}")
        # Through the outbox: an order taken while Redis is down still gets placed.
        outbox.enqueue("scheduler.place_lease", lease.pk)
        return order
    return _not_filled(order, "the GPUs were taken by other orders; try again", actor)


def _cheapest_gpus(by_node: dict, lines) -> list[tuple[NodeKey, FreeGpu]]:
    """The GPUs the match paid for: on each node, that many GPUs at each posted price."""
    keys = {key.host: key for key in by_node}
    chosen = []
    for line in lines:
        key = keys[line.node]
        at_price = [g for g in by_node[key] if g.price_micros == line.price_micros]
        taken = {g.gpu_id for _, g in chosen}
        chosen += [(key, g) for g in at_price if g.gpu_id not in taken][:line.gpus]
    return chosen


def _lease_for(order: Order, found: FoundGpus, start, end, actor) -> Lease:
    return leasing.create_lease(
        tenant=order.tenant, tier=order.tier, gpu_model=found.gpu_model, gpus=found.choices(),
        starts_at=start, ends_at=end, price_micros=found.price_micros(order.max_price_micros),
        max_price_micros=order.max_price_micros, locality=found.locality(), actor=actor,
        reason=f"order {order.pk} matched at posted prices",
        allow_moves=order.allow_moves, workload=order.workload, ssh_keys=order.ssh_keys,
        slurm_account=order.slurm_account, mig_profile=order.mig_profile,
        gpu_share=order.gpu_share,
    )


def _not_filled(order: Order, reason: str, actor: str) -> Order:
    if order.fill == Order.Fill.REST:
        if order.state == OS.RESTING:  # re-tried and still not fillable: say why, stay
            Order.objects.filter(pk=order.pk).update(reason=reason)
            order.reason = reason
            return order
        return change_order_state(order, OS.RESTING, actor=actor, reason=reason)
    release_order_hold(order, actor=actor, reason=reason)
    return change_order_state(order, OS.REFUSED, actor=actor, reason=reason)


@transaction.atomic
def cancel_order(*, order: Order, actor: str) -> Order:
    order = Order.objects.select_for_update().get(pk=order.pk)
    if order.state not in (OS.OPEN, OS.RESTING, OS.QUEUED):
        raise OrderError(f"a {order.state} order cannot be cancelled", code="invalid_state")
    release_order_hold(order, actor=actor, reason="cancelled")
    return change_order_state(order, OS.CANCELLED, actor=actor, reason="cancelled by the tenant")



def retry_resting_orders(*, actor: str = "market") -> list[int]:
    """Re-try resting on-demand orders, oldest first (capacity may have freed)."""
    filled = []
    resting = Order.objects.filter(state=OS.RESTING, tier=Lease.Tier.ON_DEMAND).order_by(
        "created_at", "pk").values_list("pk", flat=True)
    for order_id in resting:
        with transaction.atomic():
            order = Order.objects.select_for_update(skip_locked=True).filter(
                pk=order_id, state=OS.RESTING).first()
            if order is None:
                continue  # taken by an overlapping beat, or changed meanwhile
            if match_on_demand(order=order, actor=actor).state == OS.FILLED:
                filled.append(order.pk)
    return filled

"""Finding capacity: `GET /api/v1/offers/`, the free GPUs of the public market grouped (by
model, fabric, leaf, provider) and filtered by a query (`market.core.offers_query`), evaluated
in PostgreSQL in one statement, whatever the number of GPUs (docs/api-offers.md).

Free: for sale now (`market.prices.gpus_for_sale`, with a price offered over the next hour) and
held by no allocation over the next hour. A `share` term widens that to the shareable GPUs with
a free run that wide over the hour (free ones, and ones already holding shares).

Three steps, all in SQL:
1. per GPU (the ORM): the free GPUs, less those the per-GPU terms (model, fabric, provider,
   mig_profile, share) refuse, counted per *cell* (group keys × fabric × spine × leaf ×
   provider), with the cheapest and dearest price and whether they sell parts;
2. per group: cells summed; `leaf_free`/`spine_free` the largest sum over one leaf / spine of
   the group; `reliability` the lowest of its providers' (`pool.reliability`);
3. the aggregate terms (gpus, price, leaf_free, spine_free, reliability) as a WHERE over the
   groups, the sort, the limit, and the count of groups that matched before the limit.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.contrib.postgres.aggregates import BoolOr
from django.db import connection, transaction
from django.db.models import BooleanField, Count, ExpressionWrapper, F, Max, Min, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from billing.core.money import MICROS_PER_DOLLAR, to_dollars
from market.core.offers_query import OffersQuery, Term
from market.prices import gpus_for_sale
from pool.models import Gpu, GpuModel
from pool.reliability import provider_reliability, recent_provider_reliability

HORIZON = timedelta(hours=1)  # free: held by nothing from now to an hour from now

# the per-GPU fields' columns (through the ORM)
GPU_PATHS = {"model": "gpu_model__name", "fabric": "node__fabric__name",
             "provider": "node__provider__slug"}
# the groups' columns (step 3); price is compared in micro-dollars
GROUP_COLUMNS = {"gpus": "gpus", "price": "low", "max_price": "high", "leaf_free": "leaf_free",
                 "spine_free": "spine_free", "reliability": "reliability"}
SQL_OPS = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}

# The widest free run of thousandths on a GPU over [%s, %s): all of it when nothing holds it
# (most GPUs: one index probe), none when a whole GPU or a MIG slice holds it (slices and
# shares never share a GPU), else the widest gap its shares' spans leave.
SHARE_ROOM_SQL = """
CASE WHEN NOT EXISTS (SELECT 1 FROM market_allocation a WHERE a.gpu_id = "pool_gpu"."id"
                       AND a.period && tstzrange(%s, %s))
THEN 1000
WHEN EXISTS (SELECT 1 FROM market_allocation a WHERE a.gpu_id = "pool_gpu"."id"
              AND a.part <> 'share' AND a.period && tstzrange(%s, %s))
THEN 0 ELSE COALESCE((SELECT MAX(upper(r) - lower(r)) FROM unnest(
        int4multirange(int4range(0, 1000)) - COALESCE(
            (SELECT range_agg(a.span) FROM market_allocation a
              WHERE a.gpu_id = "pool_gpu"."id" AND a.period && tstzrange(%s, %s)),
            '{}'::int4multirange)) AS r), 0) END
"""


def group_keys(query: OffersQuery) -> tuple[str, ...]:
    """The columns a group is keyed by: `group_by`, with the fabric when grouped by leaf
    (leaf names are unique only within a fabric)."""
    keys = set(query.group_by)
    if "leaf" in keys:
        keys.add("fabric")
    return tuple(key for key in ("model", "fabric", "leaf", "provider") if key in keys)


def find_offers(query: OffersQuery, *, now: datetime | None = None) -> dict:
    """`{"results": [...], "count": n}`: the groups of free GPUs that satisfy the query, sorted
    and limited; `count` is how many groups matched before the limit. Two queries (the
    providers' reliability, cached for a minute when `now` is not given, then the offers)."""
    reliability = (recent_provider_reliability() if now is None
                   else provider_reliability(now=now))
    now = now or timezone.now()
    cells = _cells(query, now)
    rows, count = _groups(query, cells, reliability)
    return {"results": _render(query, rows), "count": count}


# --- step 1: per GPU ----------------------------------------------------------------------------


def _free_gpus(query: OffersQuery, now: datetime) -> QuerySet[Gpu]:
    end = now + HORIZON
    gpus = gpus_for_sale(now=now, window=(now, end))
    min_share, no_share = _share_terms(query.per_gpu())
    if min_share is None:
        gpus = gpus.exclude(allocations__period__overlap=(now, end))
    else:  # free GPUs and GPUs already holding shares, each with a free run that wide
        gpus = (gpus.filter(shareable=True)
                .alias(share_room=RawSQL(SHARE_ROOM_SQL, (now, end) * 3))
                .filter(share_room__gte=min_share))
    if no_share:
        gpus = gpus.filter(shareable=False)
    for term in query.per_gpu():
        if term.field in GPU_PATHS:
            gpus = gpus.filter(_condition(GPU_PATHS[term.field], term))
        elif term.field == "mig_profile":
            gpus = gpus.filter(_mig_condition(term))
    return gpus


def _share_terms(terms: list[Term]) -> tuple[int | None, bool]:
    """The smallest share every `share` term asks to fit (None: none asks), and whether one
    asks for GPUs that sell no shares (`share=false`)."""
    sizes, no_share = [], False
    for term in terms:
        if term.field != "share":
            continue
        if term.value is False:
            no_share = True
        elif term.value is True:
            sizes.append(1)
        else:
            sizes.append(term.value + 1 if term.op == ">" else term.value)
    return (max(sizes) if sizes else None), no_share


def _condition(path: str, term: Term) -> Q:
    if term.op == "in":
        return Q(**{f"{path}__in": list(term.value)})
    match = Q(**{path: term.value})
    return ~match if term.op == "!=" else match


def _mig_condition(term: Term) -> Q:
    """The GPU sells slices of the profile: shareable, of a MIG-capable model that has it."""
    profiles = term.value if term.op == "in" else (term.value,)
    sells = Q()
    for profile in profiles:
        sells |= Q(gpu_model__mig_profiles__contains=[profile])
    sells = Q(shareable=True, gpu_model__mig_capable=True) & sells
    return ~sells if term.op == "!=" else sells


def _cells(query: OffersQuery, now: datetime) -> tuple[str, tuple]:
    """The free GPUs counted per group keys × fabric × spine × leaf × provider: SQL, params."""
    sells_slices = ExpressionWrapper(Q(shareable=True, gpu_model__mig_capable=True),
                                     output_field=BooleanField())
    cells = (
        _free_gpus(query, now).order_by()
        .values(model=F("gpu_model__name"), fabric=F("node__fabric__name"),
                spine=F("node__host__spine"), leaf=F("node__host__leaf"),
                provider=F("node__provider__slug"), provider_id=F("node__provider_id"))
        .annotate(n=Count("id"), low=Min("prices__price_micros"),
                  high=Max("prices__price_micros"), shares=BoolOr("shareable"),
                  slices=BoolOr(sells_slices))
    )
    return cells.query.sql_with_params()


# --- steps 2 and 3: per group ------------------------------------------------------------------


def _groups(query: OffersQuery, cells: tuple[str, tuple],
            reliability: dict[int, Decimal | None]) -> tuple[list[dict], int]:
    keys = group_keys(query)
    cells_sql, cells_params = cells
    k = ", ".join(keys)
    qualified = ", ".join(f"cells.{key}" for key in keys)
    per_leaf = ", ".join(dict.fromkeys((*keys, "fabric", "leaf")))
    per_spine = ", ".join(dict.fromkeys((*keys, "fabric", "spine")))
    where, where_params = _where(query.per_group())
    direction = "DESC" if query.descending else "ASC"
    sort = GROUP_COLUMNS.get(query.sort, query.sort)
    measured = [(pid, value) for pid, value in reliability.items() if value is not None]
    sql = (
        "WITH cells AS (" + cells_sql + "), "
        "rel AS (SELECT * FROM unnest(%s::bigint[], %s::numeric[]) AS r(provider_id, value)), "
        f"groups AS (SELECT {qualified}, SUM(cells.n)::int AS gpus, MIN(cells.low) AS low, "
        "MAX(cells.high) AS high, BOOL_OR(cells.shares) AS shares, "
        "BOOL_OR(cells.slices) AS slices, MIN(rel.value) AS reliability "
        f"FROM cells LEFT JOIN rel ON rel.provider_id = cells.provider_id GROUP BY {qualified}), "
        f"leaves AS (SELECT {k}, MAX(n)::int AS leaf_free FROM (SELECT {per_leaf}, "
        f"SUM(n) AS n FROM cells GROUP BY {per_leaf}) AS x GROUP BY {k}), "
        f"spines AS (SELECT {k}, MAX(n)::int AS spine_free FROM (SELECT {per_spine}, "
        f"SUM(n) AS n FROM cells GROUP BY {per_spine}) AS x GROUP BY {k}) "
        f"SELECT {k}, gpus, low, high, leaf_free, spine_free, reliability, shares, slices, "
        "COUNT(*) OVER () AS matched "
        f"FROM groups JOIN leaves USING ({k}) JOIN spines USING ({k}) "
        f"WHERE {where} ORDER BY {sort} {direction} NULLS LAST, {k} LIMIT %s"
    )
    params = (*cells_params, [pid for pid, _ in measured], [v for _, v in measured],
              *where_params, query.limit)
    # JIT compiling costs PostgreSQL about a second whenever the per-GPU share subquery
    # pushes the estimate over jit_above_cost, for a statement that runs in a fraction of it
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql, params)
        names = [column.name for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    return rows, (rows[0]["matched"] if rows else 0)


def _where(terms: list[Term]) -> tuple[str, list]:
    """The aggregate terms as SQL over the groups (all must hold)."""
    clauses, params = ["TRUE"], []
    for term in terms:
        column = GROUP_COLUMNS[term.field]
        value = term.value
        if term.field == "price":  # dollars → micro-dollars, exactly (a Decimal)
            value = (tuple(v * MICROS_PER_DOLLAR for v in value) if term.op == "in"
                     else value * MICROS_PER_DOLLAR)
        if term.op == "in":
            clauses.append(f"{column} = ANY(%s)")
            params.append(list(value))
        else:
            clauses.append(f"{column} {SQL_OPS[term.op]} %s")
            params.append(value)
    return " AND ".join(clauses), params


def _render(query: OffersQuery, rows: list[dict]) -> list[dict]:
    keys = group_keys(query)
    profiles = {}
    if any(row["slices"] for row in rows):
        profiles = dict(GpuModel.objects.filter(name__in={row["model"] for row in rows})
                        .values_list("name", "mig_profiles"))
    results = []
    for row in rows:
        result = {key: row[key] for key in keys}
        result.update({
            "gpus": row["gpus"],
            "price_per_gpu_hour": to_dollars(row["low"]),
            "max_price_per_gpu_hour": to_dollars(row["high"]),
            "leaf_free": row["leaf_free"],
            "spine_free": row["spine_free"],
            "reliability": None if row["reliability"] is None else str(row["reliability"]),
            "mig_profiles": list(profiles.get(row["model"], [])) if row["slices"] else [],
            "shares": bool(row["shares"]),
        })
        results.append(result)
    return results

"""A book of one clearing as JSON, in and out: what `manage.py clear_book` reads and prints.

Pure Python, no Django. The formats are a contract (docs/auctions.md):

    book:   {"levels": ["spine", "leaf", "node"],
             "nodes": [{"name", "gpu_model", "labels": {"spine": "s0", "leaf": "l0"},
                        "reserve_prices": ["2.10", ...], "runtime"?}],
             "bids": [{"id", "gpus", "hours", "max_price_per_gpu_hour", "gpu_models",
                       "topology": {"required", "preferred", "slice": {"size", "level"}},
                       "submitted_at"?, "runtimes"?}
                      or {"id", "alternatives": [shape, ...], "submitted_at"?}]}
    answer: {"markets": [{"gpu_model", "clearing_price", "welfare", "welfare_bound", "gap",
                          "optimal", "accepted": [{"id", "alternative", "assignment", "price"}],
                          "refused": [{"id", "reason", "price_to_win"}]}]}

One reserve price per free GPU, as text; `labels` name the node's domain at every level but
the last. Prices and welfare are text in dollars, `gap` a fraction as text. A malformed book
raises `InvalidInput` naming the JSON path of the first error, e.g.
`bids[3].max_price_per_gpu_hour: not a price`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from billing.core.money import BadAmount, parse_dollars
from market.core.clearing import Bid, NodeOffer, Topology, check_topology, dollars
from market.core.whatif import (
    InvalidInput,
    read_int,
    read_list,
    read_object,
    read_text,
    read_texts,
)
from market.core.winners import (
    MAX_ALTERNATIVES,
    MIN_ALTERNATIVES,
    AlternativeBid,
    Order,
    WelfareClearing,
)
from pool.core.workloads import RUNTIMES

BOOK_KEYS = {"levels", "nodes", "bids"}
NODE_KEYS = {"name", "gpu_model", "labels", "reserve_prices", "runtime"}
SHAPE_KEYS = {"gpus", "hours", "max_price_per_gpu_hour", "gpu_models", "topology", "runtimes"}
BID_KEYS = {"id", "alternatives", "submitted_at"} | SHAPE_KEYS
TOPOLOGY_KEYS = {"required", "preferred", "slice"}


@dataclass(frozen=True)
class Book:
    levels: tuple[str, ...]
    nodes: tuple[NodeOffer, ...]
    bids: tuple[Order, ...]


def price(value: Any, field: str) -> int:
    """A price in dollars as text ("2.10") -> micro-dollars."""
    if not isinstance(value, str):
        raise InvalidInput(field, "not a price (give dollars as text, e.g. \"2.10\")")
    try:
        amount = parse_dollars(value)
    except BadAmount:
        raise InvalidInput(field, "not a price") from None
    if amount < 0:
        raise InvalidInput(field, "not a price (negative)")
    return amount


def hours(value: Any, field: str) -> Decimal:
    if isinstance(value, int) and not isinstance(value, bool):
        amount = Decimal(value)
    elif isinstance(value, str):
        try:
            amount = Decimal(value)
        except InvalidOperation:
            raise InvalidInput(field, "not a number of hours") from None
    else:
        raise InvalidInput(field, "not a number of hours (an integer or decimal text)")
    if not amount.is_finite() or amount <= 0:
        raise InvalidInput(field, "must be positive")
    return amount


def read_runtimes(value: Any, field: str) -> frozenset[str] | None:
    """The node runtimes a bid may use; absent: any node."""
    if value is None:
        return None
    runtimes = read_texts(value, field)
    for i, runtime in enumerate(runtimes):
        if runtime not in RUNTIMES:
            raise InvalidInput(f"{field}[{i}]", f"must be one of {', '.join(RUNTIMES)}")
    return frozenset(runtimes)


def read_node(raw: Any, field: str, levels: tuple[str, ...]) -> NodeOffer:
    raw = read_object(raw, field, NODE_KEYS)
    name = read_text(raw.get("name"), f"{field}.name")
    gpu_model = read_text(raw.get("gpu_model"), f"{field}.gpu_model")
    labels = raw.get("labels", {})
    if not isinstance(labels, dict):
        raise InvalidInput(f"{field}.labels", "must be an object")
    for level in levels[:-1]:
        read_text(labels.get(level), f"{field}.labels.{level}")
    prices = read_list(raw.get("reserve_prices"), f"{field}.reserve_prices")
    reserves = tuple(price(p, f"{field}.reserve_prices[{i}]") for i, p in enumerate(prices))
    runtime = read_text(raw.get("runtime"), f"{field}.runtime", optional=True) or "none"
    if runtime not in RUNTIMES:
        raise InvalidInput(f"{field}.runtime", f"must be one of {', '.join(RUNTIMES)}")
    return NodeOffer(name, {level: labels[level] for level in levels[:-1]}, gpu_model,
                     reserves, runtime=runtime)


def read_topology(raw: Any, field: str, levels: tuple[str, ...]) -> Topology:
    if raw is None:
        return Topology()
    raw = read_object(raw, field, TOPOLOGY_KEYS)
    size = level = None
    if raw.get("slice") is not None:
        raw_slice = read_object(raw["slice"], f"{field}.slice", {"size", "level"})
        size = read_int(raw_slice.get("size"), f"{field}.slice.size", minimum=1)
        level = read_text(raw_slice.get("level"), f"{field}.slice.level", optional=True)
    topology = Topology(
        required=read_text(raw.get("required"), f"{field}.required", optional=True),
        preferred=read_text(raw.get("preferred"), f"{field}.preferred", optional=True),
        slice_size=size, slice_level=level)
    check_topology(topology, levels, field)
    return topology


def read_shape(raw: dict, field: str, bid_id: str, levels: tuple[str, ...],
               models: set[str], submitted_at: datetime | None) -> Bid:
    gpus = read_int(raw.get("gpus"), f"{field}.gpus", minimum=1)
    topology = read_topology(raw.get("topology"), f"{field}.topology", levels)
    if topology.slice_size is not None and gpus % topology.slice_size:
        raise InvalidInput(f"{field}.topology.slice.size", "must divide gpus")
    gpu_models = None
    if raw.get("gpu_models") is not None:
        gpu_models = frozenset(read_texts(raw["gpu_models"], f"{field}.gpu_models"))
        if gpu_models and not gpu_models & models:
            raise InvalidInput(f"{field}.gpu_models",
                               f"names no market in this book (markets: "
                               f"{', '.join(sorted(models)) or 'none'})")
    runtimes = read_runtimes(raw.get("runtimes"), f"{field}.runtimes")
    return Bid(
        id=bid_id, gpus=gpus, hours=hours(raw.get("hours"), f"{field}.hours"),
        limit_micros=price(raw.get("max_price_per_gpu_hour"),
                           f"{field}.max_price_per_gpu_hour"),
        gpu_models=gpu_models or None, topology=topology, submitted_at=submitted_at,
        runtimes=runtimes)


def read_bid(raw: Any, field: str, levels: tuple[str, ...], models: set[str]) -> Order:
    raw = read_object(raw, field, BID_KEYS)
    raw_id = raw.get("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)
    bid_id = read_text(raw_id, f"{field}.id")
    submitted_at = read_moment(raw.get("submitted_at"), f"{field}.submitted_at")
    if "alternatives" not in raw:
        return read_shape(raw, field, bid_id, levels, models, submitted_at)
    given = sorted(SHAPE_KEYS & set(raw))
    if given:
        raise InvalidInput(f"{field}.alternatives",
                           f"give either one shape or alternatives, not both ({given[0]} "
                           f"is given too)")
    alternatives = read_list(raw["alternatives"], f"{field}.alternatives")
    if not MIN_ALTERNATIVES <= len(alternatives) <= MAX_ALTERNATIVES:
        raise InvalidInput(f"{field}.alternatives",
                           f"give {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} alternatives, "
                           f"not {len(alternatives)}")
    shapes = []
    for i, alternative in enumerate(alternatives):
        where = f"{field}.alternatives[{i}]"
        alternative = read_object(alternative, where, SHAPE_KEYS)
        if not alternative.get("gpu_models"):
            raise InvalidInput(f"{where}.gpu_models",
                               "names no market: give the GPU model(s) it may use")
        shapes.append(read_shape(alternative, where, bid_id, levels, models, submitted_at))
    return AlternativeBid(bid_id, tuple(shapes), submitted_at)


def read_moment(value: Any, field: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidInput(field, "not an ISO 8601 time") from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise InvalidInput(field, "not an ISO 8601 time")


def read_book(document: Any) -> Book:
    """The book, or `InvalidInput` naming the JSON path of the first error."""
    document = read_object(document, "input", BOOK_KEYS)
    levels = tuple(read_texts(document.get("levels"), "levels"))
    if not levels or len(set(levels)) != len(levels):
        raise InvalidInput("levels", "must name distinct levels, the node level last")
    raw_nodes = read_list(document.get("nodes"), "nodes")
    nodes = []
    names: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        node = read_node(raw, f"nodes[{i}]", levels)
        if node.name in names:
            raise InvalidInput(f"nodes[{i}].name", f"duplicate node {node.name!r}")
        names.add(node.name)
        nodes.append(node)
    models = {node.gpu_model for node in nodes}
    raw_bids = read_list(document.get("bids"), "bids")
    bids = []
    ids: set[str] = set()
    for i, raw in enumerate(raw_bids):
        bid = read_bid(raw, f"bids[{i}]", levels, models)
        if bid.id in ids:
            raise InvalidInput(f"bids[{i}].id", f"duplicate bid {bid.id!r}")
        ids.add(bid.id)
        bids.append(bid)
    return Book(levels, tuple(nodes), tuple(bids))


def book_json(levels, nodes, bids) -> dict:
    """The book a clearing is solved from, in the format `read_book` reads: what the auction
    service should store with each clearing so that `export_book` can write it back."""
    def topology(shape: Bid) -> dict:
        t = shape.topology
        out = {key: value for key, value in (("required", t.required),
                                             ("preferred", t.preferred)) if value}
        if t.slice_size is not None:
            out["slice"] = {"size": t.slice_size,
                            **({"level": t.slice_level} if t.slice_level else {})}
        return out

    def shape_json(shape: Bid) -> dict:
        out = {"gpus": shape.gpus, "hours": str(shape.hours),
               "max_price_per_gpu_hour": str(dollars(shape.limit_micros))}
        if shape.gpu_models:
            out["gpu_models"] = sorted(shape.gpu_models)
        if topology(shape):
            out["topology"] = topology(shape)
        if shape.runtimes is not None:
            out["runtimes"] = sorted(shape.runtimes)
        return out

    def bid_json(order: Order) -> dict:
        out: dict = {"id": order.id}
        if isinstance(order, AlternativeBid):
            out["alternatives"] = [shape_json(shape) for shape in order.alternatives]
        else:
            out.update(shape_json(order))
        if order.submitted_at is not None:
            out["submitted_at"] = order.submitted_at.isoformat()
        return out

    return {
        "levels": list(levels),
        "nodes": [{"name": node.name, "gpu_model": node.gpu_model,
                   "labels": {level: node.labels[level] for level in levels[:-1]},
                   "reserve_prices": [str(dollars(p)) for p in node.reserve_micros],
                   **({"runtime": node.runtime} if node.runtime != "none" else {})}
                  for node in nodes],
        "bids": [bid_json(order) for order in bids],
    }


def _money(micros: int | None) -> str | None:
    return None if micros is None else str(dollars(micros))


def clearing_json(clearing: WelfareClearing) -> dict:
    """The answer (see the module notes); a refused bid with no price to win says why in
    its reason."""
    markets = []
    for market in clearing.markets:
        refused = []
        for loser in market.refused:
            reason = loser.reason
            if loser.price_to_win_micros is None and loser.price_to_win_reason:
                if loser.price_to_win_reason not in reason:
                    reason += f"; no price would do: {loser.price_to_win_reason}"
            refused.append({"id": loser.bid.id, "reason": reason,
                            "price_to_win": _money(loser.price_to_win_micros)})
        markets.append({
            "gpu_model": market.gpu_model,
            "clearing_price": _money(market.clearing_price_micros),
            "welfare": str(market.welfare),
            "welfare_bound": str(market.welfare_bound),
            "gap": str(market.gap),
            "optimal": market.optimal,
            "accepted": [{"id": winner.bid.id, "alternative": winner.alternative,
                          "assignment": dict(winner.assignment),
                          "price": _money(winner.price_micros)}
                         for winner in market.accepted],
            "refused": refused,
        })
    return {"markets": markets}

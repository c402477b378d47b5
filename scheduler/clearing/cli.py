"""`python -m scheduler.clearing`: the operator's what-if tool for one market clearing.

Reads one JSON object on stdin (levels, nodes with reserve prices, bids, `mode` auction or
on_demand) and writes the clearing on stdout, prices as decimal strings. Malformed input exits
with status 2 and one line on stderr naming the field; refused bids are part of a normal
answer. The clearing is `market.core.clearing`'s, placed by the placement engine
(`scheduler.core.clearing_placer.IndexPlacer`), the same code the market runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from market.core.book import hours, read_runtimes, read_topology
from market.core.clearing import (
    AuctionClearing,
    Bid,
    MakePlacer,
    MarketClearing,
    NodeOffer,
    OnDemandResult,
    RefusedBid,
    clear_auction,
    dollars,
    match_on_demand,
    micros,
)
from market.core.whatif import (
    InvalidInput,
    answer_json,
    read_bool,
    read_int,
    read_list,
    read_object,
    read_text,
    read_texts,
)
from pool.core.workloads import RUNTIMES
from scheduler.core.clearing_placer import IndexPlacer

USAGE = "usage: python -m scheduler.clearing < clearing.json"
DOCUMENT_KEYS = {"levels", "nodes", "bids", "mode", "exact"}
NODE_KEYS = {"name", "labels", "free_gpus", "gpu_model", "reserve_prices", "reserve_price",
             "runtime"}
BID_KEYS = {"id", "gpus", "hours", "max_price_per_gpu_hour", "gpu_models", "topology",
            "submitted_at", "runtimes"}
MODES = ("auction", "on_demand")


def _price(value: Any, field: str) -> int:
    if not isinstance(value, str):
        raise InvalidInput(field, "must be a decimal string such as \"2.10\"")
    return micros(value, field)


def parse_node(raw: Any, position: int, levels: Sequence[str]) -> NodeOffer:
    field = f"nodes[{position}]"
    raw = read_object(raw, field, NODE_KEYS)
    name = read_text(raw.get("name"), f"{field}.name")
    labels = raw.get("labels", {})
    if not isinstance(labels, dict):
        raise InvalidInput(f"{field}.labels", "must be an object")
    for level in levels[:-1]:
        read_text(labels.get(level), f"{field}.labels.{level}")
    free = read_int(raw.get("free_gpus"), f"{field}.free_gpus", too_small="must be at least 0")
    gpu_model = read_text(raw.get("gpu_model"), f"{field}.gpu_model")
    if ("reserve_prices" in raw) == ("reserve_price" in raw):
        raise InvalidInput(f"{field}.reserve_prices",
                           "give either reserve_prices (one per free GPU) or reserve_price")
    if "reserve_price" in raw:
        prices = [_price(raw["reserve_price"], f"{field}.reserve_price")] * free
    else:
        listed = raw["reserve_prices"]
        if not isinstance(listed, list) or len(listed) != free:
            raise InvalidInput(f"{field}.reserve_prices",
                               "must be a list with one price per free GPU")
        prices = [_price(p, f"{field}.reserve_prices[{i}]") for i, p in enumerate(listed)]
    runtime = read_text(raw.get("runtime"), f"{field}.runtime", optional=True) or "none"
    if runtime not in RUNTIMES:
        raise InvalidInput(f"{field}.runtime", f"must be one of {', '.join(RUNTIMES)}")
    return NodeOffer(name, dict(labels), gpu_model, tuple(prices), runtime=runtime)


def _submitted_at(value: Any, field: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidInput(field, "must be an ISO 8601 time or seconds since 1970") from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    raise InvalidInput(field, "must be an ISO 8601 time or seconds since 1970")


def parse_bid(raw: Any, position: int, levels: Sequence[str]) -> Bid:
    """A bid; `id` may be a string or an integer (kept as text)."""
    field = f"bids[{position}]"
    raw = read_object(raw, field, BID_KEYS)
    raw_id = raw.get("id")
    if isinstance(raw_id, int) and not isinstance(raw_id, bool):
        raw_id = str(raw_id)
    bid_id = read_text(raw_id, f"{field}.id")
    gpus = read_int(raw.get("gpus"), f"{field}.gpus", minimum=1)
    models = raw.get("gpu_models")
    topology = read_topology(raw.get("topology"), f"{field}.topology", tuple(levels))
    if topology.slice_size is not None and gpus % topology.slice_size:
        raise InvalidInput(f"{field}.topology.slice.size", "must divide gpus")
    return Bid(
        id=bid_id,
        gpus=gpus,
        hours=hours(raw.get("hours"), f"{field}.hours"),
        limit_micros=_price(raw.get("max_price_per_gpu_hour"),
                            f"{field}.max_price_per_gpu_hour"),
        gpu_models=None if models is None else frozenset(read_texts(models, f"{field}.gpu_models")),
        topology=topology,
        submitted_at=_submitted_at(raw.get("submitted_at"), f"{field}.submitted_at"),
        # a what-if bid states its runtimes itself (absent: any node, Slurm ones included);
        # a market order naming no workload, SSH keys or Slurm account is modelled with
        # ["none", "process", "ssh"] (`pool.core.workloads.runtimes_for`)
        runtimes=read_runtimes(raw.get("runtimes"), f"{field}.runtimes"),
    )


def _refuse_repeats(names: list[str], field: str, what: str) -> None:
    """The first name seen before is refused at its position (`field` has a `{}` for it)."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise InvalidInput(field.format(i), f"duplicate {what} {name!r}")
        seen.add(name)


def parse_document(document: Any) -> tuple[list[str], list[NodeOffer], list[Bid], str, bool]:
    document = read_object(document, "input", DOCUMENT_KEYS)
    levels = read_texts(document.get("levels"), "levels")
    if not levels or len(set(levels)) != len(levels):
        raise InvalidInput("levels", "must name distinct levels, the node level last")
    raw_nodes = read_list(document.get("nodes"), "nodes")
    nodes = [parse_node(raw, i, levels) for i, raw in enumerate(raw_nodes)]
    _refuse_repeats([node.name for node in nodes], "nodes[{}].name", "node")
    raw_bids = read_list(document.get("bids"), "bids")
    bids = [parse_bid(raw, i, levels) for i, raw in enumerate(raw_bids)]
    _refuse_repeats([bid.id for bid in bids], "bids[{}].id", "bid")
    mode = document.get("mode", "auction")
    if mode not in MODES:
        raise InvalidInput("mode", f"must be one of {', '.join(MODES)}")
    exact = read_bool(document.get("exact", True), "exact")
    return levels, nodes, bids, mode, exact


def _money(amount_micros: int | None) -> str | None:
    return None if amount_micros is None else str(dollars(amount_micros))


def refused_json(refusal: RefusedBid) -> dict:
    return {"id": refusal.bid.id, "reason": refusal.reason}


def market_json(market: MarketClearing) -> dict:
    exact = market.exact
    return {
        "gpu_model": market.gpu_model,
        "clearing_price": _money(market.clearing_price_micros),
        "gpus_sold": market.gpus_sold,
        "welfare": str(market.welfare),
        "accepted": [
            {"id": accepted.bid.id, "gpus": accepted.bid.gpus, "hours": str(accepted.bid.hours),
             "assignment": dict(accepted.assignment),
             "price_per_gpu_hour": _money(accepted.price_micros), "total": str(accepted.total)}
            for accepted in market.accepted
        ],
        "refused": [refused_json(refusal) for refusal in market.refused],
        "exact": None if exact is None else {
            "welfare": str(exact.welfare), "greedy_welfare": str(exact.greedy_welfare),
            "gap": str(exact.gap), "optimal": exact.optimal,
        },
    }


def auction_json(clearing: AuctionClearing) -> dict:
    return {
        "mode": "auction",
        "markets": [market_json(market) for market in clearing.markets],
        "refused": [refused_json(refusal) for refusal in clearing.refused],
    }


def on_demand_json(result: OnDemandResult) -> dict:
    return {
        "mode": "on_demand",
        "matched": [
            {"id": match.bid.id, "gpus": match.bid.gpus, "hours": str(match.bid.hours),
             "assignment": dict(match.assignment),
             "gpus_by_price": [{"node": line.node, "price_per_gpu_hour": _money(line.price_micros),
                                "gpus": line.gpus} for line in match.lines],
             "cost_per_hour": _money(match.cost_per_hour_micros), "total": str(match.total)}
            for match in result.matched
        ],
        "refused": [refused_json(refusal) for refusal in result.refused],
    }


def run_document(document: Any, make_placer: MakePlacer) -> dict:
    levels, nodes, bids, mode, exact = parse_document(document)
    if mode == "on_demand":
        return on_demand_json(match_on_demand(levels, nodes, bids, make_placer))
    return auction_json(clear_auction(levels, nodes, bids, make_placer, exact=exact))


def main(argv: list[str], stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    if argv:
        print(USAGE, file=stderr)
        return 2
    return answer_json(lambda document: run_document(document, IndexPlacer), stdin, stdout,
                       stderr)

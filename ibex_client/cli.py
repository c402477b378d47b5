"""`ibex`: the exchange from a shell. Every command takes `--json` (machine output, stable
keys), `--explain` (the HTTP requests as `curl` lines on stderr, the key as `$IBEX_API_KEY`)
and `--profile`. Exit status: 0 done, 1 refused or failed (why on stderr), 2 bad usage."""

from __future__ import annotations

import argparse
import getpass
import json
import os
import re
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path

from ibex_client import config, output
from ibex_client.client import Client, new_idempotency_key
from ibex_client.errors import ApiError
from ibex_client.models import plain

QUERY_HELP = """\
QUERY is sent to the server as `q` (GET /api/v1/offers/?q=...), which parses it: terms
separated by spaces, each FIELD OP VALUE (e.g. `model=H100-80GB gpus>=16 price<=2.50`). A
malformed query is refused naming the term and column, e.g. `q: term 2 at column 14: unknown
field ...`; the server's message lists the fields it knows."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Usage(Exception):
    """Bad usage found after parsing: exit 2."""


# --- argument types -------------------------------------------------------------------------


def dollars(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not an amount: {text!r}") from None
    if not value.is_finite() or value < 0:
        raise argparse.ArgumentTypeError(f"not an amount: {text!r}")
    return value


BANDWIDTH_CLASSES = ("guaranteed", "standard", "scavenger")
BANDWIDTH_SPEC = "guaranteed:GBPS (Gb/s per GPU), standard or scavenger"


def bandwidth(text: str) -> dict:
    """`--bandwidth guaranteed:50` / `standard` / `scavenger` as the order's `bandwidth`."""
    name, sep, rate = (part.strip() for part in text.partition(":"))
    if name not in BANDWIDTH_CLASSES:
        raise argparse.ArgumentTypeError(f"unknown class {name!r}: use {BANDWIDTH_SPEC}")
    if name != "guaranteed":
        if sep:
            raise argparse.ArgumentTypeError(f"only guaranteed takes Gb/s per GPU: give "
                                             f"{name} alone")
        return {"class": name}
    if not rate:
        raise argparse.ArgumentTypeError("guaranteed needs its Gb/s per GPU: guaranteed:50")
    try:
        gbps = Decimal(rate)
    except InvalidOperation:
        gbps = None
    if gbps is None or not gbps.is_finite() or gbps <= 0:
        raise argparse.ArgumentTypeError(f"guaranteed:{rate}: Gb/s per GPU is a number above "
                                         f"0, e.g. guaranteed:50")
    return {"class": "guaranteed", "gbps_per_gpu": format(gbps.normalize(), "f")}


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number from 1: {text!r}")
    return int(text)


def whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(text)


RELATIVE = re.compile(r"^\+(\d+)\s*(m|min|h|d)$")


def moment(text: str) -> datetime:
    """ISO 8601 (UTC unless it says), or `+30m`, `+2h`, `+1d` from now."""
    match = RELATIVE.match(text.strip())
    if match:
        unit = {"m": "minutes", "min": "minutes", "h": "hours", "d": "days"}[match[2]]
        return datetime.now(UTC) + timedelta(**{unit: int(match[1])})
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601, or +30m, +2h, +1d)") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    return name, value


# --- the parser ------------------------------------------------------------------------------


def common_options() -> argparse.ArgumentParser:
    # SUPPRESS: given after the command, they do not overwrite what came before it
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine output: JSON with stable keys on stdout")
    common.add_argument("--explain", action="store_true", default=argparse.SUPPRESS,
                        help="print each HTTP request as a curl line on stderr (the key as "
                             "$IBEX_API_KEY)")
    common.add_argument("--profile", default=argparse.SUPPRESS,
                        help="the profile of ~/.config/ibex/config.toml (default: "
                             "$IBEX_PROFILE or 'default')")
    return common


def order_options(parser: argparse.ArgumentParser, *, bid: bool) -> None:
    what = parser.add_argument_group("what")
    what.add_argument("--gpus", type=positive, help="whole GPUs")
    what.add_argument("--mig-profile", metavar="P", help="MIG slices of this profile (--count)")
    what.add_argument("--share", type=positive, metavar="S",
                      help="shares of a GPU in thousandths, 1-999 (--count)")
    what.add_argument("--count", type=positive, metavar="N", help="how many slices or shares")
    what.add_argument("--model", action="append", metavar="MODEL",
                      help="a GPU model; repeat for several")
    what.add_argument("--within", choices=["node", "leaf", "spine"],
                      help="all GPUs within one node, leaf or spine (required)")
    what.add_argument("--prefer-within", choices=["node", "leaf", "spine"], metavar="LEVEL",
                      help="as close as that, if it can (preferred)")
    what.add_argument("--hours", type=positive)
    tiers = ["spot", "reserved"] if bid else ["on_demand", "spot", "reserved"]
    what.add_argument("--tier", choices=tiers, default=tiers[0])
    what.add_argument("--max-price", type=dollars, metavar="PRICE",
                      help="limit per GPU-hour (per part-hour for parts)"
                           + ("" if bid else "; default: the dearest price on offer for the "
                                             "models, after a quote"))
    what.add_argument("--alternative", action="append", default=[], metavar="SPEC",
                      help="instead of the flags above, one shape of a bid over 2 to 8 "
                           "alternatives (at most one wins): gpus=N,model=M[|M2],hours=N,"
                           "price=P[,within=LEVEL|prefer=LEVEL]; spot or reserved bids only")
    what.add_argument("--bandwidth", type=bandwidth, metavar="CLASS",
                      help=f"the lease's bandwidth class on the fabric: {BANDWIDTH_SPEC} "
                           f"(default standard)")
    what.add_argument("--start-after", type=moment, metavar="TIME",
                      help="start no earlier (ISO 8601 or +2h); reserved bids need it")
    what.add_argument("--start-before", type=moment, metavar="TIME",
                      help="start no later (default: --start-after)")
    what.add_argument("--fill", choices=["fill_or_kill", "rest"])
    work = parser.add_argument_group("what the lease runs")
    work.add_argument("--command", action="store_true",
                      help="the command is everything after `--`, one process per node")
    work.add_argument("--env", action="append", type=env_pair, default=[], metavar="NAME=VALUE")
    work.add_argument("--workdir", default="", help="relative to the lease's home")
    work.add_argument("--ssh-key", action="append", default=[], metavar="FILE",
                      help="OpenSSH public keys let into the lease's nodes")
    parser.add_argument("--idempotency-key", metavar="KEY",
                        help="the key of a retried command (default: a fresh one, printed)")
    parser.add_argument("--wait", action="store_true",
                        help="wait for the lease to be active")
    parser.add_argument("--timeout", type=positive, default=600, metavar="S",
                        help="with --wait: give up after S seconds (default 600)")


def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="ibex", parents=[common], description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    def command(name: str, help_text: str, **kw) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text,
                              **kw)

    p = command("login", "store an API key for a profile (read from a prompt or $IBEX_API_KEY)")
    p.add_argument("--api", help="the exchange's address, e.g. https://ibex.example.com")

    p = command("offers", "free capacity for sale, grouped", epilog=QUERY_HELP,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("query", nargs="*", metavar="QUERY")
    p.add_argument("--sort", metavar="FIELD[-]", help="e.g. price, or price- for descending")
    p.add_argument("--group-by", metavar="FIELDS", help="of model,fabric,leaf,provider")
    p.add_argument("--limit", type=positive, metavar="N")

    p = command("quote", "what an order would get now: price, total, placement")
    order_options(p, bid=False)
    p = command("order", "place an order (on demand by default)")
    order_options(p, bid=False)
    p = command("bid", "an auction bid: a spot or reserved order with a limit price")
    order_options(p, bid=True)
    p = command("orders", "your orders, newest first")
    p.add_argument("--state")
    p.add_argument("--limit", type=positive, default=50, metavar="N")
    p = command("cancel", "cancel an order that is not filled")
    p.add_argument("order", type=positive, metavar="ORDER")

    p = command("leases", "your leases, newest first")
    p.add_argument("--state")
    p.add_argument("--limit", type=positive, default=50, metavar="N")
    p = command("lease", "one lease: GPUs, locality, SLA, workload")
    p.add_argument("lease", type=positive, metavar="ID")
    p = command("extend", "extend a lease while its GPUs stay free")
    p.add_argument("lease", type=positive, metavar="ID")
    p.add_argument("--hours", type=positive, required=True)
    p = command("terminate", "end a lease now")
    p.add_argument("lease", type=positive, metavar="ID")
    p = command("ssh", "log in to a node of a lease (ssh arguments after --)")
    p.add_argument("lease", type=positive, metavar="ID")
    p.add_argument("--node-rank", type=whole, default=0, metavar="N")
    p = command("logs", "a rank's output")
    p.add_argument("lease", type=positive, metavar="ID")
    p.add_argument("--node-rank", type=whole, default=0, metavar="N")
    p.add_argument("--since", metavar="CURSOR", help="after this cursor (from --json output)")
    p.add_argument("--follow", "-f", action="store_true", help="until the lease ends")
    p = command("events", "events about your leases")
    p.add_argument("--lease", type=positive, metavar="ID")
    p.add_argument("--kind")
    p.add_argument("--limit", type=positive, default=20, metavar="N")
    p.add_argument("--follow", "-f", action="store_true", help="then wait for new ones")

    command("balance", "your balances and spend limits")
    p = command("invoices", "months with invoices, or one month's invoice")
    p.add_argument("--month", metavar="YYYY-MM")
    p = command("top-up", "top up by card: prints the payment to confirm")
    p.add_argument("amount", type=dollars, metavar="AMOUNT")
    p.add_argument("--idempotency-key", metavar="KEY")

    p = command("provider", "provider commands: nodes, drain, price, earnings")
    psub = p.add_subparsers(dest="provider_command", metavar="COMMAND", required=True)
    q = psub.add_parser("nodes", parents=[common], help="your nodes")
    q.add_argument("--state")
    q = psub.add_parser("drain", parents=[common], help="take no new leases on a node")
    q.add_argument("node", metavar="NODE", help="id or hostname")
    q.add_argument("--mode", choices=["move", "run_to_end"], required=True)
    q.add_argument("--reason")
    q = psub.add_parser("price", parents=[common], help="price GPUs per GPU-hour")
    q.add_argument("--fabric")
    q.add_argument("--model")
    q.add_argument("--leaf")
    q.add_argument("--node")
    q.add_argument("--price", type=dollars, required=True)
    q.add_argument("--min-lease-hours", type=positive)
    q = psub.add_parser("earnings", parents=[common], help="owed, held back, monthly statements")
    q.add_argument("--months", type=positive, default=12)
    return parser


# --- output ----------------------------------------------------------------------------------


class Out:
    def __init__(self, as_json: bool):
        self.json = as_json

    def emit(self, data, text: str | None = None) -> None:
        if self.json:
            print(json.dumps(plain(data), indent=2, sort_keys=True))
        elif text is not None:
            print(text)

    def line(self, data) -> None:
        """One JSON document per line (what --follow prints with --json)."""
        print(json.dumps(plain(data), sort_keys=True), flush=True)

    @staticmethod
    def note(text: str) -> None:
        print(text, file=sys.stderr)


# --- commands ------------------------------------------------------------------------------


def do_login(args, out: Out) -> int:
    api = args.api or os.environ.get("IBEX_API") or config.read_profiles().get(
        config.profile_name(args.profile), {}).get("api")
    if not api:
        raise Usage("give --api URL (or set IBEX_API)")
    key = os.environ.get("IBEX_API_KEY") or getpass.getpass("API key: ").strip()
    if not key:
        raise Usage("no key given")
    client = make_client(args, api=api, key=key)
    me = client.whoami()
    name = config.profile_name(args.profile)
    path = config.save_profile(name, api=api, key=key)
    out.emit({"profile": name, "api": client.api, "config": str(path),
              "username": me.get("username"), "organizations": me.get("organizations", []),
              "scopes": me.get("scopes", [])},
             f"logged in to {client.api} as {', '.join(me.get('organizations', [])) or me.get('username')}"
             f" (scopes {', '.join(me.get('scopes', []))}); key stored in {path} "
             f"(profile {name})")
    return EXIT_OK


def do_offers(args, client: Client, out: Out) -> int:
    group_by = [g.strip() for g in args.group_by.split(",")] if args.group_by else None
    offers = client.offers(" ".join(args.query), sort=args.sort, group_by=group_by,
                           limit=args.limit)
    keys = [k for k in ("model", "fabric", "leaf", "provider")
            if any(getattr(o, k) is not None for o in offers)]
    rows = [[getattr(o, k) for k in keys]
            + [o.gpus, output.money(o.price_per_gpu_hour, per="GPU-h"),
               output.money(o.max_price_per_gpu_hour), o.leaf_free, o.spine_free,
               "-" if o.reliability is None else f"{o.reliability * 100:.2f} %",
               ",".join(o.mig_profiles + (["shares"] if o.shares else [])) or "-"]
            for o in offers]
    headers = [k.upper() for k in keys] + ["GPUS", "PRICE", "UP TO", "LEAF FREE",
                                            "SPINE FREE", "RELIABILITY", "PARTS"]
    out.emit([o.to_json() for o in offers],
             output.table(rows, headers, right={len(keys)}) if offers else "no offers")
    return EXIT_OK


ALTERNATIVE_SPEC = "gpus=N,model=M[|M2...],hours=N,price=P[,within=LEVEL|prefer=LEVEL]"
SHAPE_FLAGS = (("--gpus", "gpus"), ("--mig-profile", "mig_profile"), ("--share", "share"),
               ("--count", "count"), ("--model", "model"), ("--within", "within"),
               ("--prefer-within", "prefer_within"), ("--hours", "hours"),
               ("--max-price", "max_price"))
LEVELS = ("node", "leaf", "spine")
MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 8


def alternative(position: int, spec: str) -> dict:
    """One `--alternative` SPEC (`gpus=16,model=H100-80GB|H200,within=leaf,hours=4,
    price=2.40`) as `Client.bid`'s alternative; bad input names the flag's position (from 1)
    and the key."""
    where = f"--alternative {position}"
    given: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise Usage(f"{where}: not KEY=VALUE: {item.strip()!r} (SPEC is {ALTERNATIVE_SPEC})")
        if key not in ("gpus", "model", "hours", "price", "within", "prefer"):
            raise Usage(f"{where}: {key}: unknown key (SPEC is {ALTERNATIVE_SPEC})")
        if key in given:
            raise Usage(f"{where}: {key}: given twice" + (" (several models are model=A|B)"
                                                         if key == "model" else ""))
        given[key] = value
    missing = [key for key in ("gpus", "model", "hours", "price") if key not in given]
    if missing:
        raise Usage(f"{where}: {missing[0]}: missing (SPEC is {ALTERNATIVE_SPEC})")
    if "within" in given and "prefer" in given:
        raise Usage(f"{where}: prefer: give within or prefer, not both")
    shape: dict = {}
    for key, kind in (("gpus", positive), ("hours", positive), ("price", dollars)):
        try:
            shape[key] = kind(given[key])
        except argparse.ArgumentTypeError as exc:
            raise Usage(f"{where}: {key}: {exc}") from None
    models = [m.strip() for m in given["model"].split("|")]
    if not all(models):
        raise Usage(f"{where}: model: a GPU model, or several as A|B: {given['model']!r}")
    for key in ("within", "prefer"):
        if key in given and given[key] not in LEVELS:
            raise Usage(f"{where}: {key}: one of {', '.join(LEVELS)}: {given[key]!r}")
    return {"gpus": shape["gpus"], "model": models, "hours": shape["hours"],
            "max_price": shape["price"],
            **{key: given[key] for key in ("within", "prefer") if key in given}}


def alternatives_of(args) -> list[dict]:
    """`--alternative`s, which replace every flag of one shape; bids only."""
    if args.command_name == "quote":
        raise Usage("ibex quote prices one shape: --alternative is for bids (ibex bid)")
    if args.tier == "on_demand":
        raise Usage("--alternative is for auction bids: give --tier spot or reserved "
                    "(or use ibex bid)")
    shape = [flag for flag, name in SHAPE_FLAGS if getattr(args, name) is not None]
    if shape:
        raise Usage(f"--alternative replaces {', '.join(shape)}: give each shape as an "
                    f"--alternative, not both")
    count = len(args.alternative)
    if not MIN_ALTERNATIVES <= count <= MAX_ALTERNATIVES:
        raise Usage(f"give {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} --alternative "
                    f"({count} given)")
    return [alternative(position, spec) for position, spec in enumerate(args.alternative, 1)]


def order_kwargs(args) -> dict:
    if args.alternative:
        kw = dict(alternatives=alternatives_of(args))
    else:
        kw = dict(shape_kwargs(args), alternatives=None)
    return dict(kw, tier=args.tier, start_after=args.start_after,
                start_before=args.start_before, command=args.rest or None,
                env=dict(args.env), workdir=args.workdir, ssh_keys=work_kwargs(args),
                fill=args.fill, bandwidth=args.bandwidth)


def shape_kwargs(args) -> dict:
    required = ["--model"] * (args.model is None) + ["--hours"] * (args.hours is None) + (
        ["--max-price"] * (args.command_name == "bid" and args.max_price is None))
    if required:
        raise Usage(f"the following arguments are required: {', '.join(required)} (or give "
                    f"a bid's shapes as --alternative)" if args.command_name == "bid" else
                    f"the following arguments are required: {', '.join(required)}")
    products = [n for n, v in (("--gpus", args.gpus), ("--mig-profile", args.mig_profile),
                               ("--share", args.share)) if v is not None]
    if len(products) != 1:
        raise Usage("give exactly one of --gpus, --mig-profile P --count N, --share S --count N")
    if products != ["--gpus"] and args.count is None:
        raise Usage(f"{products[0]} needs --count N")
    if args.within and args.prefer_within:
        raise Usage("give --within or --prefer-within, not both")
    return dict(gpus=args.gpus, mig_profile=args.mig_profile, share=args.share,
                count=args.count, model=args.model, within=args.within,
                prefer=args.prefer_within, hours=args.hours, max_price=args.max_price)


def work_kwargs(args) -> list[str]:
    """Checks the lease's command; returns the SSH keys of --ssh-key."""
    if args.command and not args.rest:
        raise Usage("--command takes the command after `--`: ibex order ... --command -- "
                    "python train.py")
    if args.rest and not args.command:
        raise Usage("arguments after `--` need --command")
    keys = []
    for name in args.ssh_key:
        try:
            text = Path(name).expanduser().read_text()
        except OSError as exc:
            raise Usage(f"--ssh-key {name}: {exc.strerror}") from None
        keys += [line.strip() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    return keys


def what_text(gpus: int | None, kw: dict) -> str:
    if kw.get("mig_profile"):
        thing = f"{kw['count']} × {kw['mig_profile']}"
    elif kw.get("share"):
        thing = f"{kw['count']} × {kw['share']}/1000 share"
    else:
        thing = f"{gpus} GPUs"
    return f"{thing} of {', '.join(kw['model'])}"


def unit_of(kw: dict) -> str:
    """What a price is per, as people read it: a GPU-hour, or a slice- or share-hour."""
    return "slice-h" if kw.get("mig_profile") else "share-h" if kw.get("share") else "GPU-h"


def lease_unit(lease) -> str:
    return "slice-h" if lease.mig_profile else "share-h" if lease.gpu_share else "GPU-h"


def do_quote(args, client: Client, out: Out) -> int:
    kw = order_kwargs(args)
    quote = client.quote(**kw)
    if quote.fillable:
        places = {}
        for p in quote.placement:
            places.setdefault(p.node, []).append(str(p.index))
        loc = quote.locality or {}
        text = "\n".join([
            f"{what_text(quote.gpus, kw)}, {quote.tier}, {kw['hours']} h: "
            f"{output.money(quote.price_per_gpu_hour, per=unit_of(kw))}, "
            f"total {output.money(quote.total)}",
            f"locality: {loc.get('leaves', '?')} leaf, {loc.get('spines', '?')} spine, "
            f"at most {loc.get('max_hops', '?')} hops" if loc else "locality: -",
            "placement: " + ", ".join(f"{n}/{','.join(i)}" for n, i in places.items()),
        ])
    else:
        text = f"not fillable now: {quote.reason}"
    out.emit(quote.to_json(), text)
    if not quote.fillable:
        Out.note(f"ibex: not fillable: {quote.reason}")
        return EXIT_FAILED
    return EXIT_OK


def do_order(args, client: Client, out: Out) -> int:
    kw = order_kwargs(args)
    key = args.idempotency_key or new_idempotency_key()
    Out.note(f"idempotency key: {key} (give it as --idempotency-key to retry safely)")
    if args.command_name == "bid":
        order = client.bid(idempotency_key=key, **kw)
    else:
        if kw.get("max_price") is None and not kw["alternatives"]:
            quote = client.quote(**kw)
            if not quote.fillable:
                raise ApiError(f"nothing to fill it now: {quote.reason}", code="not_fillable")
            kw["max_price"] = quote.max_price_per_gpu_hour
            Out.note(f"quoted {output.money(quote.price_per_gpu_hour, per=unit_of(kw))}, "
                     f"total {output.money(quote.total)}; limit "
                     f"{output.money(quote.max_price_per_gpu_hour, per=unit_of(kw))} (the "
                     f"dearest on offer)")
        order = client.order(idempotency_key=key, **kw)
    result = {"order": order.to_json(), "lease": None}
    if order.state in ("refused", "cancelled", "expired"):
        raise ApiError(f"order {order.id} {order.state}: {order.reason}",
                       code=f"order_{order.state}")
    text = order_text(order)
    if not args.wait:
        out.emit(result, text)
        return EXIT_OK
    if not out.json:
        print(text, flush=True)
    spinner = output.Spinner()
    started = time.monotonic()
    try:
        lease = order.wait_active(timeout_s=args.timeout, poll_s=1.0, on_poll=lambda what:
                                  spinner.tick(f"{what} ({time.monotonic() - started:.0f} s)"))
    finally:
        spinner.done()
    result["lease"] = lease.to_json()
    out.emit(result, lease_text(lease))
    return EXIT_OK


PRICE_TO_WIN_STATES = ("open", "resting", "refused", "expired")


def price_to_win_text(order) -> str:
    """`price to win: 2.41 USD/GPU-h` for a bid a clearing refused, or why no price would
    have won; "" when the server says neither (or the order is filled or cancelled)."""
    if order.state not in PRICE_TO_WIN_STATES:
        return ""
    if order.price_to_win is not None:
        return f"price to win: {output.money(order.price_to_win, per='GPU-h')}"
    if order.price_to_win_reason:
        return f"price to win: none ({order.price_to_win_reason})"
    return ""


def alternative_text(a) -> str:
    where = (f", within one {a.topology['required']}" if a.topology.get("required") else
             f", one {a.topology['preferred']} preferred" if a.topology.get("preferred") else "")
    return (f"{a.gpus} × {'|'.join(a.gpu_models)}{where}, {a.hours} h, limit "
            f"{output.money(a.max_price_per_gpu_hour, per='GPU-h')}")


def won_text(order) -> str:
    """Which alternative won, counted from 1 as --alternative is: `won 2 of 3`."""
    if not order.alternatives:
        return "-"
    if order.alternative is None:
        return f"{len(order.alternatives)} shapes"
    return f"won {order.alternative + 1} of {len(order.alternatives)}"


def order_text(order) -> str:
    lines = [f"order {order.id} {output.state(order.state)}" + (
        f": lease {order.lease}" if order.lease else f" ({order.reason})" if order.reason
        else "")]
    for position, a in enumerate(order.alternatives, 1):
        won = "  ← won" if order.alternative == position - 1 else ""
        lines.append(f"  alternative {position}  {alternative_text(a)}{won}")
    if order.bandwidth and order.bandwidth.get("class") not in (None, "standard"):
        lines.append(f"  bandwidth {bandwidth_text(order.bandwidth)}")
    if price := price_to_win_text(order):
        lines.append(f"  {price}" + (f" ({order.price_to_win_reason})"
                                     if order.price_to_win is not None
                                     and order.price_to_win_reason else ""))
    return "\n".join(lines)


def do_orders(args, client: Client, out: Out) -> int:
    orders = client.orders(state=args.state, limit=args.limit)
    rows = []
    for o in orders:
        shapes = o.alternatives if o.alternatives and o.alternative is None else [o]
        gpus = "|".join(str(x.gpus) for x in shapes)
        rows.append([
            o.id, output.state(o.state), o.tier,
            f"{gpus}×{o.mig_profile}" if o.mig_profile else gpus,
            "|".join(",".join(x.gpu_models) for x in shapes),
            "|".join(output.money(x.max_price_per_gpu_hour) for x in shapes),
            won_text(o), o.lease or "-", output.relative(o.created_at),
            "; ".join(filter(None, [o.reason, price_to_win_text(o)]))])
    out.emit([o.to_json() for o in orders], output.table(
        rows, ["ID", "STATE", "TIER", "GPUS", "MODELS", "LIMIT", "ALTERNATIVE", "LEASE",
               "CREATED", "REASON"]) if orders else "no orders")
    return EXIT_OK


def do_cancel(args, client: Client, out: Out) -> int:
    order = client.cancel(args.order)
    out.emit(order.to_json(), f"order {order.id} {output.state(order.state)}")
    return EXIT_OK


def gpus_text(lease) -> str:
    by_node: dict[str, list[str]] = {}
    for g in lease.gpus:
        part = f"{g.index}" + (f"[{g.mig_profile}]" if g.mig_profile else
                               f"[{g.share}/1000]" if g.share else "")
        by_node.setdefault(g.node, []).append(part)
    return " ".join(f"{node}/{','.join(parts)}" for node, parts in by_node.items()) or "-"


def fabric_text(fabric: dict) -> str:
    """`partition 0x1001, delivered 12.5 Gb/s (mean 10.2)`: what the lease's JSON `fabric` says."""
    parts = [f"partition {fabric['pkey']}"] if fabric.get("pkey") else []
    delivered = fabric.get("delivered_gbps") or {}
    if delivered.get("last_interval") is not None:
        mean = delivered.get("mean")
        parts.append(f"delivered {delivered['last_interval']:g} Gb/s"
                     + (f" (mean {mean:g})" if mean is not None else "")
                     + (", host shared" if delivered.get("shared") else ""))
    return ", ".join(parts) or "-"


def bandwidth_text(bandwidth: dict) -> str:
    """`guaranteed, 50 Gb/s per GPU`, `standard`, `scavenger`."""
    name = bandwidth.get("class") or "standard"
    gbps = bandwidth.get("gbps_per_gpu")
    return f"{name}, {gbps:g} Gb/s per GPU" if gbps is not None else name


def lease_text(lease) -> str:
    loc = lease.locality
    lines = [
        f"lease {lease.id}  {output.state(lease.state)}  {lease.tier}  {lease.gpu_count} × "
        f"{lease.gpu_model}" + (f" [{lease.mig_profile}]" if lease.mig_profile else "")
        + (f" [share {lease.gpu_share}/1000]" if lease.gpu_share else ""),
        f"  price     {output.money(lease.price_per_gpu_hour, per=lease_unit(lease))} "
        f"(limit {output.money(lease.max_price_per_gpu_hour)})",
        f"  runs      {output.relative(lease.starts_at)} → "
        + (f"ended {output.relative(lease.ended_at)}" if lease.ended_at
           else f"ends {output.relative(lease.ends_at)}"),
        f"  gpus      {gpus_text(lease)}",
        f"  locality  {loc.leaves} leaf, {loc.spines} spine, at most {loc.max_hops} hops"
        if loc else "  locality  -",
    ]
    if lease.bandwidth:
        lines.append(f"  bandwidth {bandwidth_text(lease.bandwidth)}")
    if lease.fabric and (lease.fabric.get("pkey") or lease.fabric.get("delivered_gbps")):
        lines.append(f"  fabric    {fabric_text(lease.fabric)}")
    if lease.sla:
        s = lease.sla
        target = (f"{s.availability_target_percent} % target" if s.availability_target_percent
                  else "no availability target")
        lines.append(f"  sla       {target}, {s.availability_percent or '-'} % so far, "
                     f"locality {'kept' if s.locality_kept else 'not kept'}, "
                     f"credited {output.money(s.credited)}")
    if lease.workload:
        w = lease.workload
        lines.append(f"  workload  {output.state(w.state)}: {' '.join(w.command)}")
        for r in w.nodes:
            code = "" if r.exit_code is None else f" (exit {r.exit_code})"
            lines.append(f"    rank {r.node_rank} on {r.node}: {output.state(r.state)}{code}"
                         + (f" {r.error}" if r.error else ""))
    for a in sorted(lease.access, key=lambda a: a.node):  # rank order
        if a.ssh or a.slurm:
            lines.append(f"  access    {a.node}: {a.ssh or a.slurm}")
    return "\n".join(lines)


def do_leases(args, client: Client, out: Out) -> int:
    leases = client.leases(state=args.state, limit=args.limit)
    rows = [[x.id, output.state(x.state), x.tier, x.gpu_count,
             x.gpu_model + (f" {x.mig_profile}" if x.mig_profile else "")
             + (f" share {x.gpu_share}/1000" if x.gpu_share else ""),
             output.money(x.price_per_gpu_hour, per=lease_unit(x)),
             output.relative(x.ended_at or x.ends_at),
             x.workload.state if x.workload else "-"] for x in leases]
    out.emit([x.to_json() for x in leases], output.table(
        rows, ["ID", "STATE", "TIER", "GPUS", "MODEL", "PRICE", "ENDS", "WORKLOAD"])
        if leases else "no leases")
    return EXIT_OK


def do_lease(args, client: Client, out: Out) -> int:
    lease = client.lease(args.lease, sla=True)
    out.emit(lease.to_json(), lease_text(lease))
    return EXIT_OK


def do_extend(args, client: Client, out: Out) -> int:
    lease = client.extend(args.lease, hours=args.hours)
    out.emit(lease.to_json(), f"lease {lease.id} now ends {output.relative(lease.ends_at)} "
                              f"({lease.ends_at:%Y-%m-%d %H:%M} UTC)")
    return EXIT_OK


def do_terminate(args, client: Client, out: Out) -> int:
    lease = client.terminate(args.lease)
    out.emit(lease.to_json(), f"lease {lease.id} {output.state(lease.state)}")
    return EXIT_OK


def do_ssh(args, client: Client, out: Out) -> int:
    lease = client.lease(args.lease)
    ranks = sorted(lease.access, key=lambda a: a.node)  # node ranks are in hostname order
    if args.node_rank >= len(ranks):
        raise ApiError(f"lease {lease.id} has no node_rank {args.node_rank}: its ranks are "
                       f"0..{len(ranks) - 1}" if ranks else f"lease {lease.id} is on no node",
                       code="invalid", field="node_rank")
    access = ranks[args.node_rank]
    if not access.ssh:
        raise ApiError(f"{access.node} offers no SSH for lease {lease.id}: order with "
                       f"--ssh-key, on nodes whose agent runs --runtime ssh",
                       code="no_ssh", field="ssh_keys")
    argv = access.ssh.split() + list(args.rest)
    if out.json:
        out.emit({"node": access.node, "node_rank": args.node_rank, "ssh": access.ssh,
                  "argv": argv})
        return EXIT_OK
    sys.stdout.flush()
    try:
        os.execvp(argv[0], argv)  # ssh takes over this process
    except OSError as exc:
        raise ApiError(f"cannot run {argv[0]}: {exc.strerror}", code="no_ssh") from None
    return EXIT_OK


def do_logs(args, client: Client, out: Out) -> int:
    for page in client.follow_logs(args.lease, node_rank=args.node_rank, since=args.since,
                                   follow=args.follow):
        if out.json:
            out.line(page.to_json())
            continue
        if page.dropped:
            Out.note(f"ibex: {page.dropped} lines lost before these")
        for text in page.lines:
            print(text, flush=True)
    return EXIT_OK


def event_text(e) -> str:
    what = " ".join(f"{k}={v}" for k, v in sorted(e.payload.items())
                    if not isinstance(v, dict | list))
    return (f"{e.occurred_at:%Y-%m-%d %H:%M:%S}  {e.kind:<18} lease {e.lease or '-'}  "
            f"{what}").rstrip()


def do_events(args, client: Client, out: Out) -> int:
    events = client.events(lease=args.lease, kind=args.kind, limit=args.limit)
    if not args.follow:
        out.emit([e.to_json() for e in events],
                 "\n".join(event_text(e) for e in reversed(events)) or "no events")
        return EXIT_OK
    for e in reversed(events):
        out.line(e.to_json()) if out.json else print(event_text(e), flush=True)
    after = events[0].id if events else 0
    for e in client.follow_events(lease=args.lease, kind=args.kind, after=after):
        out.line(e.to_json()) if out.json else print(event_text(e), flush=True)
    return EXIT_OK


def do_balance(args, client: Client, out: Out) -> int:
    b = client.balance()
    rows = [["available", output.money(b.available, b.currency)],
            ["held for orders", output.money(b.held, b.currency)],
            ["payable (provider)", output.money(b.payable, b.currency)],
            ["held back (provider)", output.money(b.held_back, b.currency)],
            ["spend limit per hour", output.money(b.spend_limit_per_hour, b.currency)],
            ["spend limit per month", output.money(b.spend_limit_per_month, b.currency)]]
    out.emit(b.to_json(), f"{b.organization}\n" + output.table(rows, None, right={1}))
    return EXIT_OK


def do_invoices(args, client: Client, out: Out) -> int:
    if args.month:
        inv = client.invoice(args.month)
        rows = [[x.lease_ref, f"{x.gpu_hours.normalize():f}",
                 output.money(x.price_per_gpu_hour, per="GPU-h"), output.money(x.amount)]
                for x in inv.lines]
        text = "\n".join([output.table(rows, ["LEASE", "GPU-HOURS", "PRICE", "AMOUNT"],
                                       right={1, 2, 3}) if rows else "no usage",
                          f"usage {output.money(inv.usage)}, credits "
                          f"{output.money(inv.credits_total)}, total {output.money(inv.total)}"])
        out.emit(inv.to_json(), text)
        return EXIT_OK
    months = client.invoices()
    out.emit([m.to_json() for m in months],
             output.table([[m.month, client.url(m.url)] for m in months], ["MONTH", "URL"])
             if months else "no invoices yet")
    return EXIT_OK


def do_top_up(args, client: Client, out: Out) -> int:
    key = args.idempotency_key or new_idempotency_key()
    Out.note(f"idempotency key: {key} (give it as --idempotency-key to retry safely)")
    top_up = client.top_up(args.amount, idempotency_key=key)
    deadline = time.monotonic() + 15
    spinner = output.Spinner()
    while not top_up.client_secret and top_up.state not in ("failed", "cancelled") \
            and time.monotonic() < deadline:  # the PaymentIntent is made by a worker
        spinner.tick(f"top-up {top_up.id}: waiting for the payment to confirm")
        time.sleep(1)
        top_up = client.get_top_up(top_up.id)
    spinner.done()
    page = client.url(f"/app/account/top-ups/{top_up.id}/")
    if top_up.client_secret:
        text = (f"top-up {top_up.id} of {output.money(top_up.amount, top_up.currency)}: "
                f"confirm PaymentIntent {top_up.payment_intent_id} by card at {page}\n"
                f"  or with Stripe.js confirmPayment(client secret {top_up.client_secret}, "
                f"publishable key {top_up.publishable_key or '-'})")
    else:
        text = (f"top-up {top_up.id} of {output.money(top_up.amount, top_up.currency)} is "
                f"{top_up.state}" + (f": {top_up.last_error}" if top_up.last_error else
                                     f"; its payment is not ready yet: see {page}"))
    out.emit({**top_up.to_json(), "confirm_url": page}, text)
    return EXIT_FAILED if top_up.state == "failed" else EXIT_OK


def do_provider(args, client: Client, out: Out) -> int:
    name = args.provider_command
    if name == "nodes":
        nodes = client.nodes(state=args.state)
        rows = [[n.id, n.hostname, n.fabric, n.gpu_model, n.gpus, output.state(n.state),
                 n.drain_mode or "-", n.health, output.relative(n.last_heartbeat_at)]
                for n in nodes]
        out.emit([n.to_json() for n in nodes], output.table(
            rows, ["ID", "HOSTNAME", "FABRIC", "MODEL", "GPUS", "STATE", "DRAIN", "HEALTH",
                   "HEARTBEAT"]) if nodes else "no nodes")
    elif name == "drain":
        node = client.drain(args.node, mode=args.mode, reason=args.reason)
        out.emit(node.to_json(), f"node {node.id} {node.hostname}: {node.state} "
                                 f"({node.drain_mode})")
    elif name == "price":
        if not any((args.fabric, args.model, args.leaf, args.node)):
            raise Usage("name what to price: --fabric, --model, --leaf and/or --node")
        change = client.set_price(price=args.price, fabric=args.fabric, model=args.model,
                                  leaf=args.leaf, node=args.node,
                                  min_lease_hours=args.min_lease_hours)
        out.emit(change.to_json(), f"{change.gpus_priced} GPUs now at "
                                   f"{output.money(change.price_per_gpu_hour, per='GPU-h')}")
    else:
        e = client.earnings(months=args.months)
        rows = [[s.month, output.money(s.earnings), output.money(s.fees),
                 output.money(s.held_back), output.money(s.net), output.money(s.paid_out)]
                for s in e.months]
        out.emit(e.to_json(), "\n".join([
            f"payable {output.money(e.payable, e.currency)}, held back "
            f"{output.money(e.held_back, e.currency)}",
            output.table(rows, ["MONTH", "EARNINGS", "FEES", "HELD BACK", "NET", "PAID OUT"],
                         right={1, 2, 3, 4, 5}) if rows else "no statements yet"]))
    return EXIT_OK


COMMANDS = {"offers": do_offers, "quote": do_quote, "order": do_order, "bid": do_order,
            "orders": do_orders, "cancel": do_cancel, "leases": do_leases, "lease": do_lease,
            "extend": do_extend, "terminate": do_terminate, "ssh": do_ssh, "logs": do_logs,
            "events": do_events, "balance": do_balance, "invoices": do_invoices,
            "top-up": do_top_up, "provider": do_provider}


def make_client(args, **kw) -> Client:
    explain = None
    if args.explain:
        def explain(line: str) -> None:
            print(line, file=sys.stderr, flush=True)
    client = Client(profile=args.profile, explain=explain, **kw)
    if args.explain:
        print(f"# the key is $IBEX_API_KEY (from {client.key_source}): export it to run these",
              file=sys.stderr)
    return client


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:  # the lease's command (`--command -- ...`) or ssh's own arguments
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, default in (("json", False), ("explain", False), ("profile", None)):
        if not hasattr(args, name):
            setattr(args, name, default)
    args.rest = rest
    if rest and args.command_name not in ("order", "bid", "quote", "ssh"):
        parser.error(f"`ibex {args.command_name}` takes nothing after --")
    out = Out(args.json)
    try:
        if args.command_name == "login":
            return do_login(args, out)
        return COMMANDS[args.command_name](args, make_client(args), out)
    except Usage as exc:
        parser.error(str(exc))
    except ApiError as exc:
        if out.json:
            print(json.dumps({"error": exc.to_json()}, indent=2, sort_keys=True))
        print(f"ibex: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    return EXIT_OK


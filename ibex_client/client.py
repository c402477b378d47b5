"""The Python client of the IBEX API: `Client().order(...).wait_active()`.

`requests` and the standard library only. Every call goes through `Client.request`: the
bearer key, JSON in and out, the API's error body as `ApiError`, and retries. A request is
retried (same body, same `Idempotency-Key`) on connection errors and 5xx when repeating it is
safe: every GET, and every POST that carries an idempotency key. Lists follow the API's
cursor pages for you.
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from urllib.parse import urlencode, urljoin

import requests

from ibex_client import config
from ibex_client.errors import BAD_ANSWER, UNREACHABLE, ApiError
from ibex_client.models import (
    LEASE_ENDED,
    ORDER_OPEN,
    Balance,
    Earnings,
    Event,
    Invoice,
    InvoiceMonth,
    Lease,
    LogPage,
    Node,
    Offer,
    Order,
    PriceChange,
    Quote,
    Sla,
    Statement,
    TopUp,
)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRIES = 3
USER_AGENT = "ibex-client/0.1"
KEY_VARIABLE = "$IBEX_API_KEY"  # what --explain prints instead of the key


def new_idempotency_key() -> str:
    return f"ibex-cli-{uuid.uuid4()}"


def curl_line(method: str, url: str, headers: dict[str, str], body: bytes | None) -> str:
    """The request as a `curl` command a shell runs as printed; the key is `$IBEX_API_KEY`."""
    parts = ["curl", "-sS", "-X", method, shlex.quote(url)]
    for name, value in headers.items():
        if name == "Authorization":
            parts += ["-H", f'"Authorization: Bearer {KEY_VARIABLE}"']
        elif name != "User-Agent":
            parts += ["-H", shlex.quote(f"{name}: {value}")]
    if body is not None:
        parts += ["--data-raw", shlex.quote(body.decode())]
    return " ".join(parts)


def _dollars(value) -> str:
    """Money for the API: a decimal string, never through float."""
    if isinstance(value, float):
        raise TypeError("give money as Decimal or str, not float")
    return str(Decimal(str(value)))


def _utc(value) -> str:
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=UTC)
        return value.isoformat().replace("+00:00", "Z")
    return str(value)


class Client:
    def __init__(self, api: str | None = None, key: str | None = None, *,
                 profile: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = 0.5,
                 explain: Callable[[str], None] | None = None,
                 session: requests.Session | None = None):
        settings = config.resolve(profile, api=api, key=key)
        self.api = settings.api
        self.profile = settings.profile
        self.key_source = settings.key_source
        self._key = settings.key
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.explain = explain
        self.session = session or requests.Session()

    def __repr__(self) -> str:
        return f"Client(api={self.api!r}, profile={self.profile!r})"

    # --- transport ----------------------------------------------------------------------------

    def url(self, path: str, params: dict | None = None) -> str:
        url = path if path.startswith(("http://", "https://")) else urljoin(
            self.api + "/", path.lstrip("/"))
        query = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        return f"{url}{'&' if '?' in url else '?'}{urlencode(query)}" if query else url

    def request(self, method: str, path: str, *, params: dict | None = None,
                body: dict | None = None, idempotency_key: str | None = None):
        url = self.url(path, params)
        headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json",
                   "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body, separators=(",", ":")).encode()
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        safe_to_repeat = method == "GET" or bool(idempotency_key)
        attempts = 1 + (self.retries if safe_to_repeat else 0)
        for attempt in range(1, attempts + 1):
            if self.explain:
                self.explain(curl_line(method, url, headers, data))
            try:
                return self._once(method, url, headers, data)
            except ApiError as exc:
                if not exc.retryable or attempt == attempts:
                    raise
            time.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")

    def _once(self, method, url, headers, data):
        try:
            answer = self.session.request(method, url, headers=headers, data=data,
                                          timeout=self.timeout_s, allow_redirects=False)
        except requests.RequestException as exc:
            raise ApiError(f"cannot reach {self.api}: {exc.__class__.__name__}: {exc}",
                           code=UNREACHABLE) from None
        if 300 <= answer.status_code < 400:
            raise ApiError(f"the server redirects to {answer.headers.get('Location')} "
                           f"({answer.status_code}): use that address as the API",
                           code="redirected", status=answer.status_code)
        try:
            body = answer.json() if answer.content else None
        except ValueError:
            body = None
            if answer.ok:
                raise ApiError(f"{url} answered {answer.status_code} with no JSON",
                               code=BAD_ANSWER, status=answer.status_code) from None
        if not answer.ok:
            raise ApiError.from_response(answer.status_code, body)
        return body

    def get(self, path: str, **params):
        return self.request("GET", path, params=params)

    def post(self, path: str, body: dict | None = None, *, idempotency_key: str | None = None):
        return self.request("POST", path, body=body if body is not None else {},
                            idempotency_key=idempotency_key)

    def paginate(self, path: str, params: dict | None = None,
                 limit: int | None = None) -> Iterator[dict]:
        """Every item of a list, page after page (`next`), or the first `limit`."""
        url, params, seen = path, dict(params or {}), 0
        while url:
            page = self.request("GET", url, params=params)
            params = None  # `next` carries the query
            items = page.get("results", []) if isinstance(page, dict) else page or []
            for item in items:
                if limit is not None and seen >= limit:
                    return
                seen += 1
                yield item
            url = page.get("next") if isinstance(page, dict) else None

    # --- identity -------------------------------------------------------------------------

    def whoami(self) -> dict:
        return self.get("/api/v1/me/")

    # --- capacity and quotes --------------------------------------------------------------

    def offers(self, query: str = "", *, sort: str | None = None,
               group_by: list[str] | str | None = None, limit: int | None = None) -> list[Offer]:
        if isinstance(group_by, list | tuple):
            group_by = ",".join(group_by)
        answer = self.get("/api/v1/offers/", q=query or None, sort=sort, group_by=group_by,
                          limit=limit)
        return [Offer.from_json(row) for row in answer.get("results", [])]

    def quote(self, **order) -> Quote:
        """What `order(**order)` would get now; takes the same arguments. The API prices a
        quote under a limit like an order: without `max_price`, the limit is the dearest
        price on offer for the models (`price_ceiling`), so the quote is the cheapest fill."""
        if order.get("max_price") is None:
            order["max_price"] = self.price_ceiling(models_of(order))
        quote = Quote.from_json(self.post("/api/v1/quote/", order_body(**order)))
        quote.max_price_per_gpu_hour = Decimal(str(order["max_price"]))
        return quote

    def price_ceiling(self, models: list[str]) -> Decimal:
        """The dearest price per GPU-hour on offer now for these models."""
        prices = [o.max_price_per_gpu_hour for o in self.offers(group_by=["model"])
                  if o.model in models and o.max_price_per_gpu_hour is not None]
        if not prices:
            raise ApiError(f"no {' or '.join(models)} is on offer now", code="not_fillable",
                           field="gpu_models")
        return max(prices)

    # --- orders ---------------------------------------------------------------------------

    def order(self, *, idempotency_key: str | None = None, **order) -> Order:
        """Place an order (see `order_body` for the arguments). Without `max_price`, it is
        quoted first and placed under the quote's limit, so it gets what was quoted (or is
        refused when nothing can fill it). Returns the Order; `.wait_active()` waits for its
        lease."""
        if order.get("max_price") is None and not order.get("alternatives"):
            quote = self.quote(**order)
            if not quote.fillable:
                raise ApiError(f"nothing to fill it now: {quote.reason}", code="not_fillable")
            order["max_price"] = quote.max_price_per_gpu_hour
        key = idempotency_key or new_idempotency_key()
        answer = self.post("/api/v1/orders/", order_body(**order), idempotency_key=key)
        return Order.from_json(answer, client=self, idempotency_key=key)

    def bid(self, *, tier: str = "spot", **order) -> Order:
        """An auction bid: a spot or reserved order, with a limit price; or, with
        `alternatives=[{"gpus", "model", "hours", "max_price", "within" or "prefer"}, ...]`
        (2 to 8, each with its own limit), a bid of which at most one shape wins."""
        if tier not in ("spot", "reserved"):
            raise ApiError("a bid is spot or reserved", code="invalid", field="tier")
        if order.get("max_price") is None and not order.get("alternatives"):
            raise ApiError("a bid needs a limit price", code="invalid",
                           field="max_price_per_gpu_hour")
        return self.order(tier=tier, **order)

    def orders(self, *, state: str | None = None, limit: int | None = None) -> list[Order]:
        return [Order.from_json(o, client=self)
                for o in self.paginate("/api/v1/orders/", {"state": state}, limit)]

    def get_order(self, order_id: int) -> Order:
        return Order.from_json(self.get(f"/api/v1/orders/{int(order_id)}/"), client=self)

    def cancel(self, order_id: int) -> Order:
        return Order.from_json(self.post(f"/api/v1/orders/{int(order_id)}/cancel/"),
                               client=self)

    def wait_active(self, order: Order | int, *, timeout_s: float = 600, poll_s: float = 1.0,
                    on_poll: Callable[[str], None] | None = None) -> Lease:
        order_id = order.id if isinstance(order, Order) else int(order)
        deadline = time.monotonic() + timeout_s
        current = order if isinstance(order, Order) else self.get_order(order_id)
        while current.lease is None:
            if current.state not in ORDER_OPEN:
                raise ApiError(f"order {order_id} is {current.state}"
                               + (f": {current.reason}" if current.reason else "")
                               + (f" (price to win: {current.price_to_win} per GPU-hour)"
                                  if current.price_to_win is not None else ""),
                               code=f"order_{current.state}")
            self._tick(on_poll, f"order {order_id} {current.state}", deadline)
            time.sleep(poll_s)
            current = self.get_order(order_id)
        while True:
            lease = self.lease(current.lease)
            if lease.state == "active":
                return lease
            if lease.state in LEASE_ENDED:
                reason = next((e.reason for e in reversed(lease.events) if e.reason), "")
                raise ApiError(f"lease {lease.id} is {lease.state}"
                               + (f": {reason}" if reason else ""), code=f"lease_{lease.state}")
            self._tick(on_poll, f"lease {lease.id} {lease.state}", deadline)
            time.sleep(poll_s)

    @staticmethod
    def _tick(on_poll, what: str, deadline: float) -> None:
        if on_poll:
            on_poll(what)
        if time.monotonic() > deadline:
            raise ApiError(f"timed out waiting: {what}", code="timeout")

    # --- leases ---------------------------------------------------------------------------

    def leases(self, *, state: str | None = None, limit: int | None = None) -> list[Lease]:
        return [Lease.from_json(x)
                for x in self.paginate("/api/v1/leases/", {"state": state}, limit)]

    def lease(self, lease_id: int, *, sla: bool = False) -> Lease:
        lease = Lease.from_json(self.get(f"/api/v1/leases/{int(lease_id)}/"))
        if sla:
            lease.sla = Sla.from_json(self.get(f"/api/v1/leases/{int(lease_id)}/sla/"))
        return lease

    def extend(self, lease_id: int, *, hours: int) -> Lease:
        return Lease.from_json(self.post(f"/api/v1/leases/{int(lease_id)}/extend/",
                                         {"hours": int(hours)}))

    def terminate(self, lease_id: int) -> Lease:
        return Lease.from_json(self.post(f"/api/v1/leases/{int(lease_id)}/terminate/"))

    def logs(self, lease_id: int, *, node_rank: int = 0, since: str | None = None) -> LogPage:
        return LogPage.from_json(self.get(f"/api/v1/leases/{int(lease_id)}/logs/",
                                          node_rank=node_rank, since=since))

    def follow_logs(self, lease_id: int, *, node_rank: int = 0, since: str | None = None,
                    follow: bool = True, poll_s: float = 1.0) -> Iterator[LogPage]:
        """Pages of a rank's output; with `follow`, until the lease has ended and the lines
        its nodes shipped by then are read."""
        ended = False
        while True:
            page = self.logs(lease_id, node_rank=node_rank, since=since)
            since = page.cursor
            if page.lines or page.dropped:
                yield page
            if page.more:
                continue
            if not follow or ended:
                return
            ended = self.lease(lease_id).ended  # then one more read for the last lines
            if not ended:
                time.sleep(poll_s)

    def events(self, *, lease: int | None = None, kind: str | None = None,
               limit: int | None = None) -> list[Event]:
        """Events about your leases, newest first."""
        return [Event.from_json(e) for e in
                self.paginate("/api/v1/events/", {"lease": lease, "kind": kind}, limit)]

    def follow_events(self, *, lease: int | None = None, kind: str | None = None,
                      after: int | None = None, poll_s: float = 2.0) -> Iterator[Event]:
        """New events as they come, oldest first (after event id `after`; by default
        after the newest one now)."""
        if after is None:
            newest = self.events(lease=lease, kind=kind, limit=1)
            after = newest[0].id if newest else 0
        while True:
            fresh = []
            for item in self.paginate("/api/v1/events/", {"lease": lease, "kind": kind}):
                if item["id"] <= after:
                    break
                fresh.append(Event.from_json(item))
            for event in reversed(fresh):
                after = max(after, event.id)
                yield event
            time.sleep(poll_s)

    # --- money ----------------------------------------------------------------------------

    def balance(self) -> Balance:
        return Balance.from_json(self.get("/api/v1/account/"))

    def invoices(self) -> list[InvoiceMonth]:
        return [InvoiceMonth(month=m["month"], url=m["url"])
                for m in self.get("/api/v1/account/invoices/")]

    def invoice(self, month: str) -> Invoice:
        return Invoice.from_json(self.get(f"/api/v1/account/invoices/{month}/"))

    def top_up(self, amount, *, idempotency_key: str | None = None) -> TopUp:
        key = idempotency_key or new_idempotency_key()
        answer = self.post("/api/v1/account/topups/", {"amount": _dollars(amount)},
                           idempotency_key=key)
        return TopUp.from_json(answer, idempotency_key=key)

    def get_top_up(self, top_up_id: int) -> TopUp:
        return TopUp.from_json(self.get(f"/api/v1/account/topups/{int(top_up_id)}/"))

    # --- providers ------------------------------------------------------------------------

    def nodes(self, *, state: str | None = None, limit: int | None = None) -> list[Node]:
        return [Node.from_json(n)
                for n in self.paginate("/api/v1/nodes/", {"state": state}, limit)]

    def node_id(self, node: int | str) -> int:
        """A node's id from its id or hostname."""
        if isinstance(node, int) or str(node).isdigit():
            return int(node)
        found = list(self.paginate("/api/v1/nodes/", {"hostname": node}))
        live = [n for n in found if n.get("state") != "retired"] or found
        if not live:
            raise ApiError(f"you have no node {node!r}", code="not_found", field="node")
        return live[0]["id"]

    def drain(self, node: int | str, *, mode: str = "run_to_end",
              reason: str | None = None) -> Node:
        body = {"mode": mode, **({"reason": reason} if reason else {})}
        return Node.from_json(self.post(f"/api/v1/nodes/{self.node_id(node)}/drain/", body))

    def set_price(self, *, price, fabric: str | None = None, model: str | None = None,
                  node: str | None = None, leaf: str | None = None,
                  min_lease_hours: int | None = None) -> PriceChange:
        scope = {k: v for k, v in (("fabric", fabric), ("gpu_model", model), ("node", node),
                                   ("leaf", leaf)) if v}
        body = {"scope": scope, "price_per_gpu_hour": _dollars(price)}
        if min_lease_hours:
            body["min_lease_hours"] = int(min_lease_hours)
        answer = self.post("/api/v1/prices/", body)
        return PriceChange(gpus_priced=answer["gpus_priced"],
                           price_per_gpu_hour=Decimal(answer["price_per_gpu_hour"]))

    def earnings(self, *, months: int = 12) -> Earnings:
        """What the provider is owed now and its statements, newest month first."""
        account = self.balance()
        statements = [Statement.from_json(self.get(f"/api/v1/account/statements/{m['month']}/"))
                      for m in self.get("/api/v1/account/invoices/")[:months]
                      if "/statements/" in m["url"]]
        return Earnings(currency=account.currency, payable=account.payable,
                        held_back=account.held_back, months=statements)


def models_of(order: dict) -> list[str]:
    model = order.get("model")
    return list(order.get("models") or []) + (
        [model] if isinstance(model, str) else list(model or []))


ALTERNATIVE_KEYS = ("gpus", "model", "models", "hours", "max_price", "within", "prefer")
SHAPE_ARGUMENTS = ("gpus", "model", "models", "hours", "max_price", "within", "prefer",
                   "mig_profile", "share", "count")


def topology_of(within: str | None, prefer: str | None) -> dict | None:
    return {"required": within} if within else {"preferred": prefer} if prefer else None


def alternative_body(position: int, shape: dict) -> dict:
    """One shape of a bid over alternatives, as the API takes it, from the client's names
    (`gpus`, `model` or `models`, `hours`, `max_price`, `within` or `prefer`)."""
    where = f"alternatives.{position}"
    unknown = sorted(set(shape) - set(ALTERNATIVE_KEYS))
    if unknown:
        raise ApiError(f"unknown key {unknown[0]!r}: an alternative takes "
                       f"{', '.join(ALTERNATIVE_KEYS)}", code="invalid",
                       field=f"{where}.{unknown[0]}")
    for name in ("gpus", "hours", "max_price"):
        if shape.get(name) is None:
            raise ApiError(f"an alternative needs {name}", code="invalid",
                           field=f"{where}.{name}")
    names = models_of(shape)
    if not names:
        raise ApiError("name a GPU model", code="invalid", field=f"{where}.gpu_models")
    if shape.get("within") and shape.get("prefer"):
        raise ApiError("give within or prefer, not both", code="invalid",
                       field=f"{where}.topology")
    body = {"gpu_models": names, "gpus": int(shape["gpus"]), "hours": int(shape["hours"]),
            "max_price_per_gpu_hour": _dollars(shape["max_price"])}
    topology = topology_of(shape.get("within"), shape.get("prefer"))
    if topology:
        body["topology"] = topology
    return body


def order_body(*, gpus: int | None = None, model: str | list[str] | None = None,
               models: list[str] | None = None, hours: int | None = None,
               tier: str = "on_demand",
               within: str | None = None, prefer: str | None = None,
               max_price=None, start_after=None, start_before=None,
               command: list[str] | None = None, env: dict[str, str] | None = None,
               workdir: str = "", ssh_keys: list[str] | None = None,
               mig_profile: str | None = None, share: int | None = None,
               count: int | None = None, fill: str | None = None,
               allow_moves: bool | None = None, alternatives: list[dict] | None = None,
               bandwidth: dict | None = None) -> dict:
    """The JSON of `POST /api/v1/orders/` (and `/quote/`) from keyword arguments: one shape
    (`gpus`, `model`, `hours`, `max_price`, `within`/`prefer`, or parts), or `alternatives`."""
    if alternatives:
        given = {"gpus": gpus, "model": model, "models": models, "hours": hours,
                 "max_price": max_price, "within": within, "prefer": prefer,
                 "mig_profile": mig_profile, "share": share, "count": count}
        both = [name for name in SHAPE_ARGUMENTS if given[name]]
        if both:
            raise ApiError(f"give either one shape ({', '.join(both)}) or alternatives, not "
                           f"both", code="invalid", field="alternatives")
        body: dict = {"tier": tier, "alternatives": [alternative_body(i, shape)
                                                     for i, shape in enumerate(alternatives)]}
    else:
        body = shape_body(gpus=gpus, model=model, models=models, hours=hours, tier=tier,
                          within=within, prefer=prefer, max_price=max_price,
                          mig_profile=mig_profile, share=share, count=count)
    if start_after is not None or start_before is not None:
        earliest = start_after if start_after is not None else datetime.now(UTC)
        body["start_window"] = {"earliest": _utc(earliest),
                                "latest": _utc(start_before if start_before is not None
                                               else earliest)}
    if command or env or workdir:
        if not command:
            raise ApiError("env and workdir go with a command", code="invalid",
                           field="workload.command")
        body["workload"] = {"command": list(command), "env": dict(env or {}),
                            "workdir": workdir}
    if ssh_keys:
        body["ssh_keys"] = list(ssh_keys)
    if fill:
        body["fill"] = fill
    if allow_moves is not None:
        body["allow_moves"] = bool(allow_moves)
    if bandwidth:  # {"class": "guaranteed", "gbps_per_gpu": 50}, {"class": "scavenger"}, ...
        body["bandwidth"] = dict(bandwidth)
    return body


def shape_body(*, gpus, model, models, hours, tier, within, prefer, max_price, mig_profile,
               share, count) -> dict:
    names = models_of({"model": model, "models": models})
    if not names:
        raise ApiError("name a GPU model", code="invalid", field="gpu_models")
    if hours is None:
        raise ApiError("give hours", code="invalid", field="hours")
    body: dict = {"gpu_models": names, "hours": int(hours), "tier": tier}
    if gpus is not None:
        body["gpus"] = int(gpus)
    if mig_profile:
        body["mig_profile"] = mig_profile
    if share is not None:
        body["gpu_share"] = int(share)
    if count is not None:
        body["count"] = int(count)
    if max_price is not None:
        body["max_price_per_gpu_hour"] = _dollars(max_price)
    else:
        raise ApiError("give a limit price", code="invalid", field="max_price_per_gpu_hour")
    topology = topology_of(within, prefer)
    if topology:
        body["topology"] = topology
    return body

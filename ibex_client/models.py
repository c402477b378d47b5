"""Typed results: one dataclass per thing the API answers, built from its JSON.

Money is `Decimal` (the API sends decimal strings), times are aware `datetime`s. `to_json()`
gives the stable shape `ibex --json` prints: exactly the dataclass's fields, money as strings,
times in ISO 8601.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibex_client.client import Client

LEASE_ENDED = ("preempted", "completed", "terminated", "failed")
ORDER_OPEN = ("open", "resting", "queued")


def money(value) -> Decimal | None:
    return None if value is None or value == "" else Decimal(str(value))


def when(value) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def plain(value: Any) -> Any:
    """JSON-ready: dataclasses by their public fields, Decimal as str, datetime as ISO."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not f.name.startswith("_")}
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class Result:
    def to_json(self) -> dict:
        return plain(self)


# --- capacity ----------------------------------------------------------------------------------


@dataclass
class Offer(Result):
    """A group of free GPUs for sale (`GET /offers/`), keyed by the group-by fields."""

    model: str | None
    fabric: str | None
    leaf: str | None
    provider: str | None
    gpus: int
    price_per_gpu_hour: Decimal | None
    max_price_per_gpu_hour: Decimal | None
    leaf_free: int | None
    spine_free: int | None
    reliability: Decimal | None
    mig_profiles: list[str]
    shares: bool

    @classmethod
    def from_json(cls, d: dict) -> Offer:
        return cls(model=d.get("model"), fabric=d.get("fabric"), leaf=d.get("leaf"),
                   provider=d.get("provider"), gpus=int(d.get("gpus") or 0),
                   price_per_gpu_hour=money(d.get("price_per_gpu_hour")),
                   max_price_per_gpu_hour=money(d.get("max_price_per_gpu_hour")),
                   leaf_free=d.get("leaf_free"), spine_free=d.get("spine_free"),
                   reliability=money(d.get("reliability")),
                   mig_profiles=list(d.get("mig_profiles") or []),
                   shares=bool(d.get("shares")))


@dataclass
class Place(Result):
    node: str
    index: int


@dataclass
class Quote(Result):
    """What an order would get now (`POST /quote/`), or why it would not be filled."""

    fillable: bool
    tier: str
    gpus: int | None
    price_per_gpu_hour: Decimal | None
    total: Decimal | None
    locality: dict | None
    placement: list[Place]
    reason: str
    max_price_per_gpu_hour: Decimal | None = None  # the limit it was asked with

    @classmethod
    def from_json(cls, d: dict) -> Quote:
        return cls(fillable=bool(d.get("fillable")), tier=d.get("tier") or "",
                   gpus=d.get("gpus"), price_per_gpu_hour=money(d.get("price_per_gpu_hour")),
                   total=money(d.get("total")), locality=d.get("locality"),
                   placement=[Place(node=p["node"], index=p["index"])
                              for p in d.get("placement") or []],
                   reason=d.get("reason") or "")


# --- orders and leases ------------------------------------------------------------------------


@dataclass
class Alternative(Result):
    """One shape of an auction bid over alternatives (at most one of them wins)."""

    gpu_models: list[str]
    gpus: int
    hours: int
    max_price_per_gpu_hour: Decimal | None
    topology: dict

    @classmethod
    def from_json(cls, d: dict) -> Alternative:
        return cls(gpu_models=list(d.get("gpu_models") or []), gpus=d.get("gpus") or 0,
                   hours=d.get("hours") or 0,
                   max_price_per_gpu_hour=money(d.get("max_price_per_gpu_hour")),
                   topology=dict(d.get("topology") or {}))


@dataclass
class Order(Result):
    id: int
    state: str
    reason: str
    lease: int | None
    gpu_models: list[str]
    gpus: int
    mig_profile: str
    gpu_share: int | None
    hours: int
    tier: str
    max_price_per_gpu_hour: Decimal | None
    topology: dict
    start_window: dict | None
    workload: dict | None
    ssh_keys: list[str]
    created_at: datetime | None
    # a bid over alternatives: its shapes, and the index of the one that won (0 for a bid of
    # one shape; None until one wins, and from servers that do not say)
    alternatives: list[Alternative] = field(default_factory=list)
    alternative: int | None = None
    # refused at the last clearing: the lowest limit per GPU-hour that would have won, or
    # None with the reason when no limit would have
    price_to_win: Decimal | None = None
    price_to_win_reason: str = ""
    # its class on the fabric: {"class": "guaranteed", "gbps_per_gpu": 50.0}, or standard
    bandwidth: dict | None = None
    idempotency_key: str | None = None  # known when this client placed it
    _client: Client | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict, client: Client | None = None,
                  idempotency_key: str | None = None) -> Order:
        return cls(id=d["id"], state=d["state"], reason=d.get("reason") or "",
                   lease=d.get("lease"), gpu_models=list(d.get("gpu_models") or []),
                   gpus=d.get("gpus") or 0, mig_profile=d.get("mig_profile") or "",
                   gpu_share=d.get("gpu_share"), hours=d.get("hours") or 0,
                   tier=d.get("tier") or "",
                   max_price_per_gpu_hour=money(d.get("max_price_per_gpu_hour")),
                   topology=dict(d.get("topology") or {}), start_window=d.get("start_window"),
                   workload=d.get("workload"), ssh_keys=list(d.get("ssh_keys") or []),
                   created_at=when(d.get("created_at")),
                   alternatives=[Alternative.from_json(a) for a in d.get("alternatives") or []],
                   alternative=d.get("alternative"),
                   price_to_win=money(d.get("price_to_win")),
                   price_to_win_reason=d.get("price_to_win_reason") or "",
                   bandwidth=d.get("bandwidth"),
                   idempotency_key=idempotency_key, _client=client)

    def wait_active(self, timeout_s: float = 600, poll_s: float = 1.0,
                    on_poll=None) -> Lease:
        """Wait for this order's lease to be active (an auction bid first waits for its
        clearing); an order refused, cancelled or expired, or a lease that fails or ends
        first, raises ApiError saying so."""
        if self._client is None:
            raise TypeError("this order was not made by a Client")
        return self._client.wait_active(self, timeout_s=timeout_s, poll_s=poll_s,
                                        on_poll=on_poll)


@dataclass
class Locality(Result):
    leaves: int
    spines: int
    max_hops: int


@dataclass
class LeaseGpu(Result):
    node: str
    index: int
    mig_profile: str | None = None
    share: int | None = None
    device: str | None = None
    enforced: bool | None = None
    error: str | None = None


@dataclass
class Rank(Result):
    node: str
    node_rank: int
    state: str
    exit_code: int | None
    started_at: datetime | None
    ended_at: datetime | None
    error: str


@dataclass
class Workload(Result):
    command: list[str]
    env: dict[str, str]
    workdir: str
    state: str
    nodes: list[Rank]


@dataclass
class Access(Result):
    node: str
    ssh: str | None
    slurm: str | None


@dataclass
class LeaseEvent(Result):
    at: datetime | None
    kind: str
    from_state: str
    to_state: str
    actor: str
    reason: str


@dataclass
class Sla(Result):
    """A lease's service level (`GET /leases/{id}/sla/`): terms, measurement, credits."""

    tier: str
    availability_target_percent: Decimal | None
    availability_percent: Decimal | None
    activation_limit_s: int | None
    activation_s: int | None
    promised_locality: Any
    locality_kept: bool | None
    owed: Decimal | None
    credited: Decimal | None

    @classmethod
    def from_json(cls, d: dict) -> Sla:
        terms, m = d.get("terms") or {}, d.get("measurement") or {}
        return cls(tier=terms.get("tier") or "",
                   availability_target_percent=money(terms.get("availability_target_percent")),
                   availability_percent=money(m.get("availability_percent")),
                   activation_limit_s=terms.get("activation_limit_s"),
                   activation_s=m.get("activation_s"),
                   promised_locality=terms.get("promised_locality"),
                   locality_kept=m.get("locality_kept"), owed=money(d.get("owed")),
                   credited=money(d.get("credited")))


@dataclass
class Lease(Result):
    id: int
    state: str
    tier: str
    gpu_model: str
    gpu_count: int
    mig_profile: str
    gpu_share: int | None
    gpus: list[LeaseGpu]
    locality: Locality | None
    price_per_gpu_hour: Decimal | None
    max_price_per_gpu_hour: Decimal | None
    starts_at: datetime | None
    ends_at: datetime | None
    ended_at: datetime | None
    preempt_at: datetime | None
    created_at: datetime | None
    workload: Workload | None
    access: list[Access]
    events: list[LeaseEvent]
    sla: Sla | None = None  # filled by Client.lease(id, sla=True)
    bandwidth: dict | None = None  # its class on the fabric, as its order asked
    fabric: dict | None = None  # its partition's P_Key and delivered bandwidth

    @classmethod
    def from_json(cls, d: dict) -> Lease:
        loc = d.get("locality")
        work = d.get("workload")
        return cls(
            id=d["id"], state=d["state"], tier=d.get("tier") or "",
            gpu_model=d.get("gpu_model") or "", gpu_count=d.get("gpu_count") or 0,
            mig_profile=d.get("mig_profile") or "", gpu_share=d.get("gpu_share"),
            gpus=[LeaseGpu(**{k: g.get(k) for k in ("node", "index", "mig_profile", "share",
                                                    "device", "enforced", "error")})
                  for g in d.get("gpus") or []],
            locality=Locality(**{k: loc[k] for k in ("leaves", "spines", "max_hops")})
            if loc else None,
            price_per_gpu_hour=money(d.get("price_per_gpu_hour")),
            max_price_per_gpu_hour=money(d.get("max_price_per_gpu_hour")),
            starts_at=when(d.get("starts_at")), ends_at=when(d.get("ends_at")),
            ended_at=when(d.get("ended_at")), preempt_at=when(d.get("preempt_at")),
            created_at=when(d.get("created_at")),
            workload=Workload(
                command=list(work.get("command") or []), env=dict(work.get("env") or {}),
                workdir=work.get("workdir") or "", state=work.get("state") or "",
                nodes=[Rank(node=r["node"], node_rank=r["node_rank"], state=r["state"],
                            exit_code=r.get("exit_code"), started_at=when(r.get("started_at")),
                            ended_at=when(r.get("ended_at")), error=r.get("error") or "")
                       for r in work.get("nodes") or []]) if work else None,
            access=[Access(node=a["node"], ssh=a.get("ssh"), slurm=a.get("slurm"))
                    for a in d.get("access") or []],
            events=[LeaseEvent(at=when(e.get("at")), kind=e.get("kind") or "",
                               from_state=e.get("from_state") or "",
                               to_state=e.get("to_state") or "", actor=e.get("actor") or "",
                               reason=e.get("reason") or "") for e in d.get("events") or []],
            bandwidth=d.get("bandwidth"),
            fabric=d.get("fabric"),
        )

    @property
    def ended(self) -> bool:
        return self.state in LEASE_ENDED


@dataclass
class LogPage(Result):
    node_rank: int
    node: str | None
    lines: list[str]
    cursor: str
    dropped: int
    more: bool

    @classmethod
    def from_json(cls, d: dict) -> LogPage:
        return cls(node_rank=d["node_rank"], node=d.get("node"), lines=list(d["lines"]),
                   cursor=d["cursor"], dropped=d.get("dropped") or 0, more=bool(d.get("more")))


@dataclass
class Event(Result):
    id: int
    kind: str
    lease: int | None
    payload: dict
    occurred_at: datetime | None
    created_at: datetime | None

    @classmethod
    def from_json(cls, d: dict) -> Event:
        return cls(id=d["id"], kind=d["kind"], lease=d.get("lease"),
                   payload=dict(d.get("payload") or {}), occurred_at=when(d.get("occurred_at")),
                   created_at=when(d.get("created_at")))


# --- money -------------------------------------------------------------------------------------


@dataclass
class Balance(Result):
    organization: str
    currency: str
    available: Decimal
    held: Decimal
    payable: Decimal
    held_back: Decimal
    spend_limit_per_hour: Decimal | None
    spend_limit_per_month: Decimal | None

    @classmethod
    def from_json(cls, d: dict) -> Balance:
        return cls(organization=d["organization"], currency=d.get("currency") or "usd",
                   available=money(d["available"]), held=money(d["held"]),
                   payable=money(d["payable"]), held_back=money(d["held_back"]),
                   spend_limit_per_hour=money(d.get("spend_limit_per_hour")),
                   spend_limit_per_month=money(d.get("spend_limit_per_month")))


@dataclass
class InvoiceMonth(Result):
    month: str
    url: str


@dataclass
class InvoiceLine(Result):
    lease_ref: str
    gpu_hours: Decimal
    price_per_gpu_hour: Decimal
    amount: Decimal
    minutes: int


@dataclass
class Invoice(Result):
    month: str
    lines: list[InvoiceLine]
    usage: Decimal
    credits_total: Decimal
    total: Decimal

    @classmethod
    def from_json(cls, d: dict) -> Invoice:
        return cls(month=d["month"], usage=money(d["usage"]),
                   credits_total=money(d["credits_total"]), total=money(d["total"]),
                   lines=[InvoiceLine(lease_ref=x["lease_ref"], gpu_hours=money(x["gpu_hours"]),
                                      price_per_gpu_hour=money(x["price_per_gpu_hour"]),
                                      amount=money(x["amount"]), minutes=x["minutes"])
                          for x in d.get("lines") or []])


@dataclass
class TopUp(Result):
    id: int
    amount: Decimal
    currency: str
    state: str
    payment_intent_id: str
    client_secret: str
    publishable_key: str
    last_error: str
    created_at: datetime | None
    idempotency_key: str | None = None

    @classmethod
    def from_json(cls, d: dict, idempotency_key: str | None = None) -> TopUp:
        return cls(id=d["id"], amount=money(d["amount"]), currency=d.get("currency") or "usd",
                   state=d["state"], payment_intent_id=d.get("payment_intent_id") or "",
                   client_secret=d.get("client_secret") or "",
                   publishable_key=d.get("publishable_key") or "",
                   last_error=d.get("last_error") or "", created_at=when(d.get("created_at")),
                   idempotency_key=idempotency_key)


# --- providers ---------------------------------------------------------------------------------


@dataclass
class Node(Result):
    id: int
    hostname: str
    fabric: str
    gpu_model: str
    state: str
    drain_mode: str
    health: str
    gpus: int
    last_heartbeat_at: datetime | None

    @classmethod
    def from_json(cls, d: dict) -> Node:
        return cls(id=d["id"], hostname=d["hostname"], fabric=d.get("fabric") or "",
                   gpu_model=d.get("gpu_model") or "", state=d.get("state") or "",
                   drain_mode=d.get("drain_mode") or "", health=d.get("health") or "",
                   gpus=len(d.get("gpus") or []),
                   last_heartbeat_at=when(d.get("last_heartbeat_at")))


@dataclass
class PriceChange(Result):
    gpus_priced: int
    price_per_gpu_hour: Decimal


@dataclass
class Statement(Result):
    month: str
    earnings: Decimal
    fees: Decimal
    held_back: Decimal
    net: Decimal
    paid_out: Decimal

    @classmethod
    def from_json(cls, d: dict) -> Statement:
        return cls(month=d["month"], **{k: money(d[k]) for k in
                                        ("earnings", "fees", "held_back", "net", "paid_out")})


@dataclass
class Earnings(Result):
    currency: str
    payable: Decimal
    held_back: Decimal
    months: list[Statement]

"""Every change to the pool goes through here: registering nodes, their state machine,
heartbeats and health, bindings the scheduler asks nodes to serve, and provider burn-in."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import (
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.utils import timezone

from fabric import selectors as fabric_selectors
from fabric import services as fabric_services
from fabric.models import Fabric, Host
from ibex.accounts import services as accounts
from ibex.accounts.models import Organization, ProviderProfile
from ibex.audit.services import record_audit
from ibex.db import analyze_after_bulk_load
from ibex.errors import Refusal
from ibex.statemachine import StateMachine, transition
from pool import workloads
from pool.core.workloads import ranks_in_order
from pool.models import Binding, Gpu, GpuModel, HealthEvent, Node, NodeStateChange

TOKEN_PREFIX = "ibexnode"
UNREACHABLE_AFTER_INTERVALS = 3
HOT_TEMPERATURE_C = 90
METRICS_KEY = "pool:metrics:{node_id}"


class RegistrationError(Refusal):
    """A node that cannot be registered; `field` names what is wrong, `code` how to answer."""


class NodeTransitionError(Refusal):
    code = "invalid_state"


class TokenRefused(Exception):
    pass


def _hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def _new_token() -> tuple[str, str, str]:
    prefix = secrets.token_hex(6)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    return raw, prefix, _hash(raw)


# --- registration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RegisteredNode:
    node: Node
    gpus: list[Gpu]
    token: str  # shown once


@dataclass(frozen=True)
class NodeSpec:
    hostname: str
    fabric: str
    gpu_model: str
    gpu_count: int
    cpu_cores: int
    memory_gib: int
    os: str = ""
    driver_version: str = ""
    gpus: tuple[dict, ...] = ()  # optional: index, uuid, memory_mib, nvlink_domain


def _fabric_of(provider: Organization, reference: str | int) -> Fabric:
    fabrics = Fabric.objects.filter(owner=provider)
    found = (fabrics.filter(pk=int(reference)) if str(reference).isdigit() else
             fabrics.filter(name=reference)).first()
    if found is None:
        raise RegistrationError(f"you have no fabric {reference!r}", field="fabric")
    return found


@transaction.atomic
def register_nodes(*, provider: Organization, specs: list[NodeSpec]) -> list[RegisteredNode]:
    """Register nodes all-or-nothing; errors name the item (`nodes.3.hostname`)."""
    if not provider.is_provider:
        raise RegistrationError("only providers register nodes", field="non_field_errors", code="permission_denied")
    models = {m.name: m for m in GpuModel.objects.all()}
    fabrics: dict[str, Fabric] = {}
    hosts: dict[tuple[int, str], Host] = {}
    for position, spec in enumerate(specs):
        where = f"nodes.{position}." if len(specs) > 1 else ""
        try:
            fabric = fabrics.get(str(spec.fabric)) or _fabric_of(provider, spec.fabric)
        except RegistrationError as exc:
            raise RegistrationError(exc.message, field=where + exc.field) from None
        fabrics[str(spec.fabric)] = fabric
        if spec.gpu_model not in models:
            raise RegistrationError(f"unknown GPU model {spec.gpu_model!r}", field=where + "gpu_model")
    for host in Host.objects.filter(fabric__in=list(fabrics.values()),
                                    name__in=[s.hostname for s in specs]):
        hosts[(host.fabric_id, host.name)] = host
    taken = set(
        Node.objects.filter(host__in=list(hosts.values())).exclude(state=Node.State.RETIRED)
        .values_list("host__fabric_id", "hostname")
    )
    seen: set[tuple[int, str]] = set()
    for position, spec in enumerate(specs):
        where = f"nodes.{position}." if len(specs) > 1 else ""
        key = (fabrics[str(spec.fabric)].id, spec.hostname)
        if key not in hosts:
            raise RegistrationError(f"{spec.hostname!r} is not a host of fabric {spec.fabric!r}", field=where + "hostname")
        if key in taken or key in seen:
            node_id = Node.objects.filter(host=hosts[key]).exclude(state="retired").values_list(
                "id", flat=True).first()
            raise RegistrationError(f"{spec.hostname} is already registered as node {node_id}", field=where + "hostname", code="node_exists")
        seen.add(key)
    return _create_nodes(provider, specs, fabrics, hosts, models)


def _create_nodes(provider, specs, fabrics, hosts, models) -> list[RegisteredNode]:
    nodes, tokens = [], []
    for spec in specs:
        raw, prefix, digest = _new_token()
        tokens.append(raw)
        fabric = fabrics[str(spec.fabric)]
        nodes.append(Node(
            provider=provider, fabric=fabric, host=hosts[(fabric.id, spec.hostname)],
            hostname=spec.hostname, gpu_model=models[spec.gpu_model], cpu_cores=spec.cpu_cores,
            memory_gib=spec.memory_gib, os=spec.os, driver_version=spec.driver_version,
            heartbeat_interval_s=settings.NODE_HEARTBEAT_INTERVAL_S,
            token_prefix=prefix, token_hash=digest,
        ))
    Node.objects.bulk_create(nodes, batch_size=2000)
    gpus, changes, per_node = [], [], []
    for node, spec in zip(nodes, specs, strict=True):
        model = models[spec.gpu_model]
        described = {g["index"]: g for g in spec.gpus}
        per_node.append([])
        for index in range(spec.gpu_count):
            detail = described.get(index, {})
            per_node[-1].append(Gpu(
                node=node, index=index, gpu_model=model, uuid=detail.get("uuid", ""),
                memory_mib=detail.get("memory_mib") or model.memory_mib,
                mig_capable=model.mig_capable, nvlink_domain=detail.get("nvlink_domain", ""),
            ))
        gpus.extend(per_node[-1])
        changes.append(NodeStateChange(node=node, from_state="", to_state=node.state,
                                       actor=provider.slug, reason="registered"))
    Gpu.objects.bulk_create(gpus, batch_size=5000)
    NodeStateChange.objects.bulk_create(changes, batch_size=5000)
    analyze_after_bulk_load(Node, Gpu, rows=len(gpus))
    return [RegisteredNode(node=n, gpus=g, token=t)
            for n, g, t in zip(nodes, per_node, tokens, strict=True)]


@transaction.atomic
def rotate_node_token(*, node: Node) -> str:
    raw, prefix, digest = _new_token()
    Node.objects.filter(pk=node.pk).update(token_prefix=prefix, token_hash=digest)
    record_audit(action="node.rotate_token", target=node, organization=node.provider,
                 details={"hostname": node.hostname, "prefix": prefix})
    return raw


# --- the node state machine -------------------------------------------------------------------

S = Node.State
NODE_TRANSITIONS = {
    S.REGISTERING: {S.ACTIVE, S.RETIRED},
    S.ACTIVE: {S.DRAINING, S.OFFLINE},
    S.DRAINING: {S.ACTIVE, S.OFFLINE, S.RETIRED},
    S.OFFLINE: {S.ACTIVE, S.RETIRED},
    S.RETIRED: set(),
}
NODE_MACHINE = StateMachine(
    name="node", transitions=NODE_TRANSITIONS, refusal=NodeTransitionError,
    history=NodeStateChange, history_of=lambda node: {"node": node},
    audit=lambda node, change: {"action": f"node.{change.to_state}", "target": node,
                                "organization": node.provider,
                                "details": {"hostname": node.hostname, "from": change.from_state,
                                            "reason": change.reason}})


class NodeChangeRefused(Refusal):
    """A correction a node may not take; `field` names the input at fault."""


DESCRIPTIVE_FIELDS = ("cpu_cores", "memory_gib", "os", "driver_version")


@transaction.atomic
def update_node(*, node: Node, actor: str, changes: dict) -> Node:
    """Correct what a provider registered: CPU cores, memory, OS and driver at any time; the GPU
    model and count only while no lease holds the node now or later. Its fabric and hostname
    never change (they are where it is: register it again)."""
    locked = Node.objects.select_for_update().get(pk=node.pk)
    for field in ("fabric", "hostname"):
        if field in changes:
            raise NodeChangeRefused(f"a node's {field} does not change: retire it and "
                                           f"register it again", field=field)
    if "gpu_model" in changes or "gpu_count" in changes:
        field = "gpu_model" if "gpu_model" in changes else "gpu_count"
        now = timezone.now()
        if Gpu.objects.filter(node=locked, allocations__period__overlap=(now, None)).exists():
            raise NodeChangeRefused("the node is leased now or later: its GPUs change "
                                           "only when no lease holds them", field=field)
        if "gpu_model" in changes:
            _change_gpu_model(locked, changes["gpu_model"])
        if "gpu_count" in changes:
            _change_gpu_count(locked, changes["gpu_count"])
    updates = {f: changes[f] for f in DESCRIPTIVE_FIELDS if f in changes}
    for field, value in updates.items():
        setattr(locked, field, value)
    if updates:
        locked.save(update_fields=list(updates))
    record_audit(action="node.update", target=locked, actor=actor,
                 organization=locked.provider, details={k: changes[k] for k in sorted(changes)})
    return locked


def _change_gpu_model(node: Node, name: str) -> None:
    model = GpuModel.objects.filter(name=name).first()
    if model is None:
        raise NodeChangeRefused(f"unknown GPU model {name!r}", field="gpu_model")
    node.gpu_model = model
    node.save(update_fields=["gpu_model"])
    Gpu.objects.filter(node=node).update(gpu_model=model, memory_mib=model.memory_mib,
                                         mig_capable=model.mig_capable,
                                         health=Gpu.Health.UNKNOWN)  # until reported again


def _change_gpu_count(node: Node, count: int) -> None:
    have = Gpu.objects.filter(node=node).count()
    if count < have:
        extra = Gpu.objects.filter(node=node, index__gte=count)
        if extra.filter(allocations__isnull=False).exists():
            raise NodeChangeRefused("the GPUs above that count have served leases: "
                                                 "retire the node and register it again", field="gpu_count")
        extra.delete()
    Gpu.objects.bulk_create([
        Gpu(node=node, index=index, gpu_model=node.gpu_model,
            memory_mib=node.gpu_model.memory_mib, mig_capable=node.gpu_model.mig_capable)
        for index in range(have, count)])


@transaction.atomic
def change_node_state(*, node: Node, to_state: str, actor: str, reason: str) -> Node:
    """The one way a node's state changes (a fresh copy of the node comes back)."""
    locked = Node.objects.select_for_update().select_related("provider").get(pk=node.pk)
    return transition(NODE_MACHINE, locked, to_state, actor=actor, reason=reason)


@transaction.atomic
def drain_node(*, node: Node, actor: str, mode: str = Node.DrainMode.RUN_TO_END,
               reason: str = "drained") -> Node:
    """Take no new leases. `move`: the scheduler moves the leases off at its next pass (those
    whose tenant allowed moves); `run_to_end`: they finish here. Either way the scheduler takes
    the node offline once nothing runs on it (`scheduler.moves.drain`)."""
    if mode not in Node.DrainMode.values:
        raise NodeTransitionError(f"unknown drain mode {mode!r}")
    locked = change_node_state(node=node, to_state=S.DRAINING, actor=actor,
                               reason=f"{reason} ({mode})")
    locked.drain_mode = mode
    locked.save(update_fields=["drain_mode"])
    return locked


# --- heartbeats and health --------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatAnswer:
    interval_s: int
    node_state: str
    actions: list[dict]


def authenticate_node(node_id: int, raw_token: str) -> Node:
    parts = raw_token.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
        raise TokenRefused("malformed node token")
    node = (
        Node.objects.filter(pk=node_id, token_prefix=parts[1])
        .annotate(has_bindings=Exists(Binding.objects.filter(node=OuterRef("pk"),
                                                             stopped_at__isnull=True)))
        .first()
    )
    if node is None or not hmac.compare_digest(node.token_hash, _hash(raw_token)):
        raise TokenRefused("unknown or revoked node token")
    if node.state == S.RETIRED:
        raise TokenRefused("this node is retired")
    return node


def gpu_health_from(report: dict) -> tuple[str, str]:
    """A GPU's health from one heartbeat's counters, and why. A gateway (Slurm) reports no
    counters but what its scheduler says: `down` (the node is down or drained there, why) and
    `busy` (it runs work outside IBEX)."""
    if report.get("down"):
        return Gpu.Health.FAILED, report["down"]
    if report.get("ecc_errors", 0) > 0:
        return Gpu.Health.FAILED, f"{report['ecc_errors']} uncorrectable ECC error(s)"
    if report.get("xid_errors", 0) > 0:
        return Gpu.Health.DEGRADED, f"{report['xid_errors']} XID error(s)"
    if report.get("temperature_c", 0) >= HOT_TEMPERATURE_C:
        return Gpu.Health.DEGRADED, f"temperature {report['temperature_c']} °C"
    if report.get("busy"):
        return Gpu.Health.BUSY, report["busy"]
    return Gpu.Health.OK, "counters clean"


# Healthy: a busy GPU works, it is just not free to sell (the node stays healthy).
_WORKING = (Gpu.Health.OK, Gpu.Health.BUSY)


# The node's registered GPU indexes, in order (compared with a heartbeat's in one UPDATE).
_registered_indexes = (Gpu.objects.filter(node_id=OuterRef("pk")).order_by().values("node_id")
                       .annotate(indexes=ArrayAgg("index", order_by="index"))
                       .values("indexes"))


def record_heartbeat(*, node: Node, gpus: list[dict], ib_ports: list[dict],
                     serving: list[str], runtime: dict | None = None,
                     workloads_reported: list[dict] = (),
                     devices_reported: dict[str, list[dict]] | None = None,
                     now: datetime | None = None) -> HeartbeatAnswer:
    """Take one heartbeat, writing only what changed (metrics go to the cache, not the DB).

    Most heartbeats change nothing but the time: one conditional UPDATE that re-checks the
    node is still as it was read. Anything else takes the locked path.
    """
    now = now or timezone.now()
    all_reported_ok = all(gpu_health_from(g)[0] == Gpu.Health.OK for g in gpus)
    steady = (
        all_reported_ok and node.healthy_since is not None
        and node.state in (S.ACTIVE, S.DRAINING, S.OFFLINE)
        and node.health == Node.Health.REACHABLE
    )
    # Steady only while the agent reports exactly the registered GPUs: a GPU it stops
    # reporting is no longer known to be healthy.
    unchanged = Node.objects.alias(registered=Subquery(_registered_indexes)).filter(
        pk=node.pk, state=node.state, health=Node.Health.REACHABLE, healthy_since__isnull=False,
        registered=sorted({g["index"] for g in gpus}))
    if node.runtime == Node.Runtime.SLURM:
        # (only gateways report busy GPUs: one that is free again must be written)
        unchanged = unchanged.exclude(Exists(Gpu.objects.filter(node=OuterRef("pk"),
                                                                health=Gpu.Health.BUSY)))
    updated = steady and unchanged.update(last_heartbeat_at=now)
    if not updated:
        node = _record_heartbeat_locked(node, gpus, now)
    if runtime is not None:
        _record_runtime(node, runtime)
    cache.set(METRICS_KEY.format(node_id=node.pk),
              {"at": now.isoformat(), "gpus": gpus, "ib_ports": ib_ports}, timeout=3600)
    return heartbeat_answer(node=node, serving=serving, workloads_reported=workloads_reported,
                            devices_reported=devices_reported, now=now)


def record_quiet_heartbeats(*, gpus_by_node: dict[int, list[int]], now: datetime) -> set[int]:
    """Heartbeats that change nothing, for many nodes at once (a gateway's report of a whole
    cluster): nodes that are healthy, reachable, in service, with every GPU ok, the GPUs
    reported exactly the registered ones, and no lease bound, get their time in one UPDATE.
    The ids written; the caller takes the others one by one (`record_heartbeat`)."""
    candidates = (
        Node.objects.annotate(registered=Subquery(_registered_indexes))
        .filter(pk__in=list(gpus_by_node), health=Node.Health.REACHABLE,
                healthy_since__isnull=False, state__in=(S.ACTIVE, S.DRAINING, S.OFFLINE))
        .exclude(Exists(Gpu.objects.filter(node=OuterRef("pk")).exclude(health=Gpu.Health.OK)))
        .exclude(Exists(Binding.objects.filter(node=OuterRef("pk"), stopped_at__isnull=True)))
        .values_list("pk", "registered"))
    quiet = [pk for pk, registered in candidates if registered == sorted(gpus_by_node[pk])]
    # (a node changed since it was read is left out by the same conditions, and is taken
    # by the next report)
    Node.objects.filter(pk__in=quiet, health=Node.Health.REACHABLE,
                        healthy_since__isnull=False).update(last_heartbeat_at=now)
    return set(quiet)


def heartbeat_answer(*, node: Node, serving: list[str], workloads_reported: list[dict] = (),
                     devices_reported: dict[str, list[dict]] | None = None,
                     now: datetime | None = None) -> HeartbeatAnswer:
    """What the node must do now for the leases bound to it (and what it reports of them)."""
    now = now or timezone.now()
    has_bindings = getattr(node, "has_bindings", True)
    actions = (_reconcile_bindings(node, set(serving), workloads_reported, now,
                                   devices_reported or {})
               if has_bindings or serving else [])
    interval = node.heartbeat_interval_s
    if any(a["action"] == "start" for a in actions) or _waits_for_rank_zero(node):
        # come back soon to say it serves them: its acknowledgement activates the lease
        interval = min(interval, settings.BINDING_ACK_INTERVAL_S)
    return HeartbeatAnswer(interval_s=interval, node_state=node.state, actions=actions)


def node_to_answer(node_id: int) -> Node:
    """The node as it is now, for an answer given after a held heartbeat was woken (its state
    may have changed meanwhile, and it may have bindings it had none of)."""
    return Node.objects.get(pk=node_id)


def _waits_for_rank_zero(node: Node) -> bool:
    return getattr(node, "waiting_ranks", False)


def _record_runtime(node: Node, runtime: dict) -> None:
    """What the node's agent offers (process, ssh, none), written only when it changes."""
    wanted = {"runtime": runtime["kind"], "address": runtime.get("address") or "",
              "ssh_port": runtime.get("ssh_port")}
    changes = {name: value for name, value in wanted.items() if getattr(node, name) != value}
    if changes:
        Node.objects.filter(pk=node.pk).update(**changes)
        for name, value in changes.items():
            setattr(node, name, value)


@transaction.atomic
def _record_heartbeat_locked(node: Node, gpus: list[dict], now: datetime) -> Node:
    has_bindings = getattr(node, "has_bindings", True)
    node = Node.objects.select_for_update().get(pk=node.pk)
    node.has_bindings = has_bindings
    if node.state == S.REGISTERING:
        node = change_node_state(node=node, to_state=S.ACTIVE, actor="agent",
                                 reason="first heartbeat")
        node.has_bindings = has_bindings
    all_ok, mismatch = _update_gpu_health(node, gpus, now)
    updates = {"last_heartbeat_at": now}
    if mismatch != node.inventory_mismatch:
        updates["inventory_mismatch"] = mismatch
        HealthEvent.objects.create(node=node, kind=HealthEvent.Kind.INVENTORY,
                                   from_value="mismatch" if node.inventory_mismatch else "agrees",
                                   to_value="mismatch" if mismatch else "agrees",
                                   detail=mismatch or "the agent reports every registered GPU")
    all_ok = all_ok and not mismatch
    if node.health == Node.Health.UNREACHABLE:
        updates["health"] = Node.Health.REACHABLE
        HealthEvent.objects.create(node=node, kind=HealthEvent.Kind.NODE_REACHABLE,
                                   from_value="unreachable", to_value="reachable",
                                   detail="heartbeat received")
    if all_ok and node.healthy_since is None:
        updates["healthy_since"] = now
    elif not all_ok and node.healthy_since is not None:
        updates["healthy_since"] = None
    Node.objects.filter(pk=node.pk).update(**updates)
    for field, value in updates.items():
        setattr(node, field, value)
    return node


def _update_gpu_health(node: Node, reports: list[dict], now: datetime) -> tuple[bool, str]:
    """Each registered GPU's health from its report (unknown when not reported); whether all
    are ok, and how the reported GPUs differ from the registered ones ("" when they agree)."""
    by_index = {r["index"]: r for r in reports}
    all_ok = True
    registered = set()
    for gpu in Gpu.objects.filter(node=node).only("id", "index", "health"):
        registered.add(gpu.index)
        report = by_index.get(gpu.index)
        if report is None:
            health, why = Gpu.Health.UNKNOWN, "not reported by the node's agent"
        else:
            health, why = gpu_health_from(report)
        all_ok = all_ok and health in _WORKING
        if health != gpu.health:
            Gpu.objects.filter(pk=gpu.pk).update(health=health, health_changed_at=now)
            if gpu.health not in (Gpu.Health.UNKNOWN, *_WORKING) or health not in _WORKING:
                # (a GPU first reported healthy is no health event, nor one that is busy with
                # other work and free again; one that vanishes or fails is)
                HealthEvent.objects.create(node=node, gpu=gpu, kind=HealthEvent.Kind.GPU_HEALTH,
                                           from_value=gpu.health, to_value=health, detail=why)
    return all_ok, inventory_mismatch(registered, set(by_index))


def inventory_mismatch(registered: set[int], reported: set[int]) -> str:
    """How a heartbeat's GPUs differ from the node's registration, for its provider and the
    operators; "" when they agree."""
    if registered == reported:
        return ""
    parts = [f"the agent reports {len(reported & registered)} of {len(registered)} "
             f"registered GPUs"]
    if registered - reported:
        parts.append(f"missing: {_indexes(registered - reported)}")
    if reported - registered:
        parts.append(f"not registered: {_indexes(reported - registered)}")
    return "; ".join(parts)


def _indexes(indexes: set[int]) -> str:
    return ", ".join(f"gpu{i}" for i in sorted(indexes))


# Called with the lease refs a heartbeat has just acknowledged (after the acknowledgement is
# written). The scheduler registers its activation here (scheduler/apps.py): the pool may not
# import it.
_acknowledgement_listeners: list[Callable[[list[str]], object]] = []


def on_bindings_acknowledged(listener: Callable[[list[str]], object]) -> None:
    if listener not in _acknowledgement_listeners:
        _acknowledgement_listeners.append(listener)


def _reconcile_bindings(node: Node, serving: set[str], reports: list[dict],
                        now: datetime, devices: dict[str, list[dict]]) -> list[dict]:
    actions = []
    wanted: set[str] = set()
    acknowledged = []
    bindings = list(Binding.objects.filter(node=node, stopped_at__isnull=True))
    by_lease = {report["lease"]: report for report in reports}
    wake = workloads.record_reports(bindings, by_lease) if by_lease else []
    if devices:
        workloads.record_devices(bindings, devices)
    for binding in bindings:
        if binding.serve:
            wanted.add(binding.lease_ref)
            if _needs_start(binding, serving, by_lease) or _parts_differ(binding, devices):
                action = workloads.start_action(binding)
                if action is None:
                    node.waiting_ranks = True
                else:
                    actions.append(action)
            elif binding.acknowledged_at is None:
                Binding.objects.filter(pk=binding.pk).update(acknowledged_at=now)
                acknowledged.append(binding.lease_ref)
            if binding.notice_until is not None and binding.lease_ref in serving:
                actions.append(workloads.notice_action(binding))
        elif binding.lease_ref not in serving:
            Binding.objects.filter(pk=binding.pk).update(stopped_at=now)
    stopping = {b.lease_ref: b for b in bindings if not b.serve}
    for lease_ref in sorted(serving - wanted):
        binding = stopping.get(lease_ref) or Binding.objects.filter(
            node=node, lease_ref=lease_ref).first()
        actions.append(workloads.stop_action(binding, lease_ref, now))
    if acknowledged:
        for listener in _acknowledgement_listeners:
            listener(acknowledged)
    workloads.wake_nodes(wake)
    return actions


def _parts_differ(binding: Binding, devices: dict[str, list[dict]]) -> bool:
    """A lease of parts whose node reports other parts than it holds (it moved to other parts
    of the node's GPUs): start it again, and the agent remakes them."""
    made = devices.get(binding.lease_ref)
    if not binding.parts or made is None:
        return False
    keys = ("index", "mig_profile", "start", "share")
    return sorted(tuple(str(p.get(k)) for k in keys) for p in binding.parts) != \
        sorted(tuple(str(d.get(k)) for k in keys) for d in made)


def _needs_start(binding: Binding, serving: set[str], reports: dict[str, dict]) -> bool:
    """Not served yet, or served with an older launch (the lease moved: a new generation)."""
    if binding.lease_ref not in serving:
        return True
    report = reports.get(binding.lease_ref)
    return bool(binding.launch) and report is not None and \
        report["generation"] != binding.generation


def mark_unreachable_nodes(*, now: datetime | None = None) -> list[int]:
    """Claim nodes silent for 3 intervals with a conditional UPDATE: safe when beats overlap."""
    now = now or timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE pool_node SET health = 'unreachable', healthy_since = NULL
            WHERE health = 'reachable' AND state IN ('active', 'draining')
              AND last_heartbeat_at < %s - make_interval(secs => heartbeat_interval_s * %s)
            RETURNING id, last_heartbeat_at
            """,
            [now, UNREACHABLE_AFTER_INTERVALS],
        )
        claimed = cursor.fetchall()
        HealthEvent.objects.bulk_create([
            HealthEvent(node_id=node_id, kind=HealthEvent.Kind.NODE_UNREACHABLE,
                        from_value="reachable", to_value="unreachable",
                        detail=f"no heartbeat since {last:%Y-%m-%d %H:%M:%S}")
            for node_id, last in claimed
        ])
    return [node_id for node_id, _ in claimed]


# --- bindings (called by the scheduler) ---------------------------------------------------------


@transaction.atomic
def bind_lease(*, node: Node, lease_ref: str, gpu_indexes: list[int]) -> Binding:
    binding, _ = Binding.objects.update_or_create(
        node=node, lease_ref=lease_ref,
        defaults={"gpu_indexes": sorted(gpu_indexes), "serve": True, "stopped_at": None},
    )
    workloads.wake_nodes([node.pk])
    return binding


@transaction.atomic
def unbind_lease(*, node: Node, lease_ref: str) -> None:
    Binding.objects.filter(node=node, lease_ref=lease_ref).update(serve=False)
    # the lease's partition follows the nodes it is still on (none left: it is released)
    # ... and so do its traffic accounts (its delivered bandwidth: docs/fabric.md)
    serving = list(Binding.objects.filter(lease_ref=lease_ref, serve=True)
                   .values_list("node__host_id", "gpu_indexes"))
    hosts_left = {lease_ref: [host for host, _ in serving]}
    fabric_services.sync_partitions(hosts_by_holder=hosts_left, gpus_by_holder={
        lease_ref: {host: indexes for host, indexes in serving}})
    fabric_services.track_lease_hosts(hosts_by_holder=hosts_left)
    workloads.wake_nodes([node.pk])


@transaction.atomic
def set_lease_bindings(*, wanted: dict[str, dict[int, list[int]]],
                       launches: dict[str, dict | None] | None = None,
                       parts: dict[str, dict[int, list[dict]]] | None = None,
                       classes: dict[str, str] | None = None) -> list[str]:
    """What every node serves of some leases, at once (after the scheduler placed or moved
    them): lease ref → node id → GPU indexes. The nodes named serve those GPUs; every other node
    serving one of these leases is told to stop. Unchanged bindings are left alone (their node
    need not acknowledge again). A few queries however many leases.

    `launches` (lease ref → {command, env, workdir, ssh_keys}) says what the nodes run for a
    lease; a lease not named keeps what it ran. A lease that runs something and whose nodes or
    GPUs change starts a new generation: every rank is restarted with the new addresses.
    Returns the refs of the leases restarted so.

    `parts` (lease ref → node id → [part]) says which parts of the GPUs a lease of parts holds
    on each node, as the agent enforces them (docs/workloads.md, "Parts of GPUs").

    `classes` (lease ref → bandwidth class, from its order: the pool knows no orders) goes to
    the lease's partitions, whose P_Key OpenSM then maps to that class's SL; a lease not named
    keeps its class (docs/fabric.md, "Bandwidth classes")."""
    wanted = {ref: {node: sorted(ix) for node, ix in nodes.items()}
              for ref, nodes in wanted.items()}
    launches = launches or {}
    parts = parts or {}
    existing = {(b.lease_ref, b.node_id): b for b in
                Binding.objects.select_for_update().filter(lease_ref__in=list(wanted))}
    restarted = [ref for ref in wanted if _launch_changes(ref, wanted[ref], existing, launches)]
    hostnames, host_of = {}, {}
    for node_id, hostname, host_id in Node.objects.filter(
            pk__in={node for nodes in wanted.values() for node in nodes}).values_list(
            "pk", "hostname", "host_id"):
        hostnames[node_id], host_of[node_id] = hostname, host_id
    stop, changed, new = [], [], []
    for (ref, node_id), binding in existing.items():
        if binding.serve and node_id not in wanted[ref]:
            stop.append(binding.pk)
    for ref, nodes in wanted.items():
        work = launches[ref] if ref in launches else _launch_of(ref, existing)
        generation = max((b.generation for (r, _), b in existing.items() if r == ref), default=0)
        ranks = ranks_in_order(hostnames[node] for node in nodes)
        for node_id, indexes in nodes.items():
            binding = existing.get((ref, node_id))
            node_parts = parts.get(ref, {}).get(node_id, [])
            if binding is None:
                binding = Binding(node_id=node_id, lease_ref=ref, gpu_indexes=indexes,
                                  parts=node_parts)
                new.append(binding)
            elif binding.gpu_indexes != indexes or not binding.serve or binding.stopped_at \
                    or ref in restarted or binding.parts != node_parts:
                binding.gpu_indexes, binding.serve, binding.stopped_at = indexes, True, None
                binding.parts = node_parts
                changed.append(binding)
            if ref in restarted or binding.pk is None:
                _restart(binding, work, generation + 1 if ref in restarted else generation,
                         ranks[hostnames[node_id]], len(nodes))
    if stop:
        Binding.objects.filter(pk__in=stop).update(serve=False)
    if changed:
        Binding.objects.bulk_update(changed, ["gpu_indexes", "parts", "serve", "stopped_at",
                                              *RESTART_FIELDS])
    if new:
        Binding.objects.bulk_create(new)
    # each lease on several nodes has its own InfiniBand partition of exactly those nodes
    # (and its traffic accounts follow its hosts: its delivered bandwidth, docs/fabric.md)
    hosts_now = {ref: [host_of[node] for node in nodes] for ref, nodes in wanted.items()}
    gpus_now = {ref: {host_of[node]: indexes for node, indexes in nodes.items()}
                for ref, nodes in wanted.items()}
    fabric_services.sync_partitions(hosts_by_holder=hosts_now, classes=classes,
                                    gpus_by_holder=gpus_now)
    fabric_services.track_lease_hosts(hosts_by_holder=hosts_now)
    workloads.wake_nodes([node for (ref, node) in existing] +
                         [node for nodes in wanted.values() for node in nodes])
    return restarted


RESTART_FIELDS = ["launch", "generation", "node_rank", "nnodes", "notice_until", "workload_state",
                  "exit_code", "started_at", "ended_at", "master_port", "workload_error",
                  "log_bytes"]


def _launch_of(ref: str, existing: dict) -> dict | None:
    return next((b.launch for (r, _), b in existing.items() if r == ref and b.launch), None)


def _launch_changes(ref: str, nodes: dict[int, list[int]], existing: dict,
                    launches: dict) -> bool:
    """Whether the lease's ranks must (re)start: it runs something, and what or where changed."""
    work = launches[ref] if ref in launches else _launch_of(ref, existing)
    if not work:
        return False
    serving = {node: b.gpu_indexes for (r, node), b in existing.items()
               if r == ref and b.serve and b.stopped_at is None}
    return serving != nodes or _launch_of(ref, existing) != work


def _restart(binding: Binding, work: dict | None, generation: int, rank: int,
             nnodes: int) -> None:
    binding.launch, binding.generation = work, generation
    binding.node_rank, binding.nnodes, binding.notice_until = rank, nnodes, None
    binding.workload_state, binding.exit_code, binding.master_port = "", None, None
    binding.started_at = binding.ended_at = None
    binding.workload_error, binding.log_bytes = "", 0


# --- provider burn-in ---------------------------------------------------------------------------


def verify_burned_in_providers(*, now: datetime | None = None) -> list[str]:
    """Verify pending providers whose active nodes have all been healthy for the burn-in time."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.PROVIDER_BURN_IN_S)
    verified = []
    pending = Organization.objects.filter(provider_profile__state=ProviderProfile.State.PENDING)
    for provider in pending:
        nodes = Node.objects.filter(provider=provider, state=S.ACTIVE)
        if not nodes.exists():
            continue
        burned_in = nodes.filter(health=Node.Health.REACHABLE, healthy_since__lte=cutoff)
        if burned_in.count() != nodes.count():
            continue
        try:
            accounts.change_provider_state(
                organization=provider, to_state=ProviderProfile.State.VERIFIED, actor="system",
                reason=f"{nodes.count()} node(s) healthy for {settings.PROVIDER_BURN_IN_S} s",
            )
        except accounts.TransitionError:
            continue  # verified meanwhile by an operator or an overlapping beat
        verified.append(provider.slug)
    return verified


def mark_shareable(*, gpu_ids: list[int], shareable: bool) -> int:
    """Whether these GPUs also sell parts (MIG slices, shares); a GPU that stops being
    shareable keeps the parts it sold until they end."""
    return Gpu.objects.filter(pk__in=gpu_ids).exclude(shareable=shareable).update(
        shareable=shareable)


def offered_gpus(*, now: datetime | None = None):
    """GPUs a tenant may be offered: verified provider, active reachable node that beat within
    one interval plus HEARTBEAT_GRACE_S, healthy GPU (reported by that node's agent), on a host
    the fabric has not cut off (every HCA cable down)."""
    now = now or timezone.now()
    return Gpu.objects.filter(
        node__provider__provider_profile__state=ProviderProfile.State.VERIFIED,
        node__state=S.ACTIVE, node__health=Node.Health.REACHABLE, health=Gpu.Health.OK,
    ).filter(Q(node__last_heartbeat_at__gte=_fresh_since(now))
             # never heard from: only data loaded without agents (tests, benchmarks); a real
             # node becomes active by its first heartbeat
             | Q(node__last_heartbeat_at__isnull=True)
             ).exclude(node__host__in=fabric_selectors.cut_off_hosts_query())


def _fresh_since(now: datetime):
    """The oldest heartbeat that still counts as recent, per node: one interval plus grace."""
    silence = ExpressionWrapper(
        (F("node__heartbeat_interval_s") + settings.HEARTBEAT_GRACE_S)
        * Value(timedelta(seconds=1)), output_field=DurationField())
    return ExpressionWrapper(Value(now) - silence, output_field=DateTimeField())


def ensure_gpu_catalogue() -> None:
    """Insert any missing catalogue GPU models (the migration seeds them; tests that flush the
    database, and the demo, call this)."""
    from pool.core.catalogue import GPU_MODELS

    existing = set(GpuModel.objects.values_list("name", flat=True))
    GpuModel.objects.bulk_create([GpuModel(**row) for row in GPU_MODELS
                                  if row["name"] not in existing])

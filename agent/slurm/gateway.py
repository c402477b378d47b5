"""`ibex-agent slurm`: one gateway in front of a Slurm cluster (docs/slurm.md).

It reads the cluster with `scontrol`, imports its topology as the fabric, registers every node
with GPUs, and then, once per interval, sends IBEX one report of all nodes
(`POST /api/v1/gateway/heartbeat/`) and makes Slurm hold exactly the reservations the answer
lists: `ibex-lease-<id>` on the lease's nodes, for its Slurm account, until it ends.

Faults: a Slurm command that gets no answer (slurmctld down or unreachable) makes the report
say `slurm unreachable: ...` and repeat the last nodes Slurm described, so one failed call never
marks the cluster down; reading is retried with backoff. A reservation Slurm refuses is
reported with Slurm's message (the server places the lease elsewhere). After a restart the first
pass creates the missing reservations and deletes `ibex-lease-*` reservations of ended leases,
and logs what it fixed.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from agent.client import ApiClient, ApiError, ServerTrouble, Unreachable
from agent.errors import AgentError
from agent.heartbeat import retry_delay
from agent.slurm.scontrol import (
    DEFAULT_GPU_MODELS,
    SlurmJob,
    SlurmNode,
    SlurmParseError,
    SlurmReservation,
    SlurmTopology,
    UnknownGpuType,
    gpu_model_for,
    parse_jobs_text,
    parse_nodes_json,
    parse_nodes_text,
    parse_reservations_text,
    parse_topology,
    topology_conf,
)
from fabric.core.hostlist import expand_hostlist

log = logging.getLogger("ibex-agent")

PREFIX = "ibex-lease-"
DEFAULT_INTERVAL_S = 15.0
SOON_S = 1.0  # after a pass that changed reservations: report it at once (activates leases)
COMMAND_TIMEOUT_S = 20.0
# What scontrol prints when it cannot reach slurmctld (anything else is Slurm refusing).
_UNREACHABLE_SIGNS = ("unable to contact slurm controller", "connection refused",
                      "connect failure", "socket timed out", "zero bytes were transmitted",
                      "communication connection failure")


class SlurmUnreachable(AgentError):
    """scontrol got no answer from slurmctld."""


class SlurmRefused(AgentError):
    """Slurm answered, and said no (its message is the error's)."""


class Scontrol:
    """Runs Slurm's commands with the environment given (SLURM_CONF is honoured)."""

    def __init__(self, env: Mapping[str, str] | None = None,
                 timeout_s: float = COMMAND_TIMEOUT_S) -> None:
        self.env = dict(env if env is not None else os.environ)
        self.timeout_s = timeout_s
        self._json_nodes: bool | None = None  # whether `scontrol show nodes --json` works

    def run(self, *args: str) -> str:
        try:
            result = subprocess.run(["scontrol", *args], env=self.env, capture_output=True,
                                    text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"scontrol {args[0]} gave no answer within "
                                   f"{self.timeout_s:g} s") from None
        except OSError as error:
            raise SlurmUnreachable(f"cannot run scontrol: {error.strerror}") from None
        if result.returncode != 0:
            message = " ".join((result.stderr or result.stdout).split()) or \
                f"exit status {result.returncode}"
            message = message.removeprefix("scontrol: error: ")
            if any(sign in message.lower() for sign in _UNREACHABLE_SIGNS):
                raise SlurmUnreachable(message)
            raise SlurmRefused(message)
        return result.stdout

    def nodes(self) -> list[SlurmNode]:
        """`--json` where this Slurm has it (23.02 on), else the text form with -d."""
        if self._json_nodes is not False:
            try:
                nodes = parse_nodes_json(self.run("show", "nodes", "--json"))
                self._json_nodes = True
                return nodes
            except (SlurmRefused, SlurmParseError):
                if self._json_nodes:
                    raise
                self._json_nodes = False
        return parse_nodes_text(self.run("-d", "-o", "show", "nodes"))

    def topology(self) -> SlurmTopology:
        return parse_topology(self.run("show", "topology"))

    def jobs(self) -> list[SlurmJob]:
        return parse_jobs_text(self.run("-d", "-o", "show", "job"))

    def reservations(self) -> list[SlurmReservation]:
        return parse_reservations_text(self.run("-o", "show", "reservation"))

    def create_reservation(self, want: Wanted) -> None:
        self.run("create", "reservation", f"ReservationName={want.name}", "StartTime=now",
                 *want.terms())

    def update_reservation(self, want: Wanted) -> None:
        self.run("update", f"ReservationName={want.name}", *want.terms())

    def delete_reservation(self, name: str) -> None:
        self.run("delete", f"ReservationName={name}")


@dataclass(frozen=True)
class Wanted:
    """A reservation the server's answer asks for."""

    name: str
    lease: str
    account: str
    ends_at: datetime
    nodes: dict[str, list[int]]  # hostname -> the lease's GPU indexes there

    @classmethod
    def from_answer(cls, item: dict) -> Wanted:
        return cls(name=str(item["name"]), lease=str(item["lease"]),
                   account=str(item.get("account") or ""),
                   ends_at=datetime.fromisoformat(str(item["ends_at"])),
                   nodes={str(k): list(v) for k, v in dict(item["nodes"]).items()})

    @property
    def end(self) -> str:
        # Slurm reads times in the controller's local time: this host's, on a cluster's hosts
        return self.ends_at.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

    def terms(self) -> list[str]:
        # Whole nodes: a reservation of GPUs (TRES=gres/gpu=N) needs slurmdbd's GRES TRES.
        return [f"Nodes={','.join(sorted(self.nodes))}", f"EndTime={self.end}",
                f"Accounts={self.account}"]

    def matches(self, held: SlurmReservation) -> bool:
        return (held.nodes == frozenset(self.nodes) and held.end == self.end
                and held.accounts == self.account)


@dataclass
class Picture:
    """The cluster as Slurm last described it."""

    nodes: list[SlurmNode]
    jobs: list[SlurmJob]
    reservations: list[SlurmReservation]


@dataclass
class Outcome:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.deleted)

    def describe(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in (
            ("created", self.created), ("updated", self.updated), ("deleted", self.deleted))
            if names]
        parts += [f"refused {r['lease']} ({r['message']})" for r in self.refused]
        return "; ".join(parts) or "nothing to fix"


def reconcile(scontrol: Scontrol, wanted: list[Wanted],
              held: list[SlurmReservation]) -> Outcome:
    """Make Slurm's `ibex-lease-*` reservations the wanted ones: create, update, delete."""
    outcome = Outcome()
    by_name = {r.name: r for r in held if r.name.startswith(PREFIX)}
    for want in wanted:
        current = by_name.get(want.name)
        if current is not None and want.matches(current):
            continue
        if not want.account:
            outcome.refused.append({"lease": want.lease,
                                    "message": "the lease names no slurm_account"})
            continue
        try:
            if current is None:
                scontrol.create_reservation(want)
                outcome.created.append(want.name)
            else:
                scontrol.update_reservation(want)
                outcome.updated.append(want.name)
        except SlurmRefused as error:
            outcome.refused.append({"lease": want.lease, "message": str(error)[:500]})
    names = {want.name for want in wanted}
    for name in sorted(set(by_name) - names):
        try:
            scontrol.delete_reservation(name)
            outcome.deleted.append(name)
        except SlurmRefused as error:
            log.warning("slurm: could not delete reservation %s: %s", name, error)
    return outcome


@dataclass
class GatewayOptions:
    api: str
    key: str
    fabric: str
    partition: str | None = None
    interval_s: float | None = None  # None: what the server says
    timeout_s: float = 10.0
    gpu_models: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_GPU_MODELS))


class SlurmGateway:
    def __init__(self, options: GatewayOptions, scontrol: Scontrol | None = None,
                 stop: threading.Event | None = None) -> None:
        self.options = options
        self.scontrol = scontrol or Scontrol()
        self.stop = stop or threading.Event()
        self.client = ApiClient(options.api, timeout_s=options.timeout_s)
        self.picture: Picture | None = None
        self.gpu_models: dict[str, str] = {}  # hostname -> IBEX model, for the registered
        self.considered: set[str] = set()  # nodes looked at for registration
        self.last_down: dict[str, str] = {}  # node -> why it was down when Slurm last knew
        self.topology: SlurmTopology | None = None
        self.wanted: list[Wanted] = []
        self.refused: list[dict] = []
        self.reconciled_once = False
        self.failures = 0
        self.interval_s = options.interval_s or DEFAULT_INTERVAL_S

    # -- setup --------------------------------------------------------------------------------

    def setup(self) -> None:
        """Import the topology and register the GPU nodes (retried until Slurm answers)."""
        failures = 0
        while not self.stop.is_set():
            try:
                topology = self.scontrol.topology()
                nodes = self._in_partition(self.scontrol.nodes())
                break
            except SlurmUnreachable as error:
                failures += 1
                log.warning("slurm: cannot read the cluster (%s); retrying", error)
                self.stop.wait(retry_delay(min(self.interval_s, 5.0), failures))
        else:
            return
        self.import_topology(topology, nodes)
        self.register(nodes)

    def import_topology(self, topology: SlurmTopology, nodes: list[SlurmNode]) -> None:
        if not topology.switches:
            raise AgentError("slurm: `scontrol show topology` lists no switches; IBEX needs "
                             "the topology/tree plugin and a topology.conf")
        gpus_per_node = max((n.gpu_count for n in nodes), default=8) or 8
        self.client.import_fabric(self.options.key, self.options.fabric,
                                  topology_conf(topology), "slurm", min(gpus_per_node, 64))
        self.topology = topology
        log.info("slurm: fabric %s imported: %d switches, %d nodes", self.options.fabric,
                 len(topology.switches), len(nodes))

    def _in_partition(self, nodes: list[SlurmNode]) -> list[SlurmNode]:
        if not self.options.partition:
            return nodes
        text = self.scontrol.run("show", "partition", self.options.partition)
        names = set()
        for word in text.split():
            if word.startswith("Nodes="):
                names.update(expand_hostlist(word.removeprefix("Nodes=")))
        return [n for n in nodes if n.name in names]

    def register(self, nodes: list[SlurmNode]) -> None:
        """Register the nodes with GPUs IBEX does not have yet; GPU types IBEX does not know
        are reported and left out."""
        known = {str(n.get("hostname")) for n in self.client.list_nodes(self.options.key)
                 if _fabric_name(n) == self.options.fabric and n.get("state") != "retired"}
        specs = []
        for node in nodes:
            self.considered.add(node.name)
            model = self._model_of(node)
            if model is None:
                continue
            if self.topology is None or self.topology.leaf_of(node.name) is None:
                log.warning("slurm: %s is on no leaf switch of the topology; left out", node.name)
                continue
            self.gpu_models[node.name] = model
            if node.name not in known:
                specs.append({
                    "hostname": node.name, "fabric": self.options.fabric, "gpu_model": model,
                    "gpu_count": node.gpu_count, "cpu_cores": max(node.cpus or 1, 1),
                    "memory_gib": max((node.memory_mib or 1024) // 1024, 1),
                    "os": "Slurm node"})
        for start in range(0, len(specs), 1000):
            self.client.register_nodes(self.options.key, specs[start:start + 1000])
        log.info("slurm: %d GPU nodes; %d registered now", len(self.gpu_models), len(specs))

    def _model_of(self, node: SlurmNode) -> str | None:
        types = {t: c for t, c in node.gpus.items() if c}
        if not types:
            return None
        if len(types) > 1:
            log.warning("slurm: %s has GPUs of several types (%s); IBEX sells one model per "
                        "node, so it is left out", node.name, ", ".join(sorted(types)))
            return None
        gres_type = next(iter(types))
        try:
            return gpu_model_for(gres_type, self.options.gpu_models)
        except UnknownGpuType as error:
            log.warning("slurm: %s left out: %s", node.name, error)
            return None

    def _register_new(self, picture: Picture, unregistered: set[str]) -> None:
        """Nodes added to Slurm since (the topology is imported again first), and nodes IBEX
        says it has not got (retired there meanwhile)."""
        try:
            new = [n for n in self._in_partition(picture.nodes) if n.name not in self.considered]
            if new:
                self.import_topology(self.scontrol.topology(), picture.nodes)
        except (SlurmUnreachable, SlurmRefused, SlurmParseError) as error:
            log.warning("slurm: cannot read the new nodes' topology (%s); trying again", error)
            return
        again = [n for n in picture.nodes if n.name in unregistered and n.name not in
                 {m.name for m in new}]
        if new or again:
            self.register(new + again)

    # -- one pass -----------------------------------------------------------------------------

    def read(self) -> tuple[Picture | None, str]:
        try:
            picture = Picture(nodes=self.scontrol.nodes(), jobs=self.scontrol.jobs(),
                              reservations=self.scontrol.reservations())
        except SlurmUnreachable as error:
            return self.picture, f"slurm unreachable: {error}"
        except (SlurmRefused, SlurmParseError) as error:
            return self.picture, f"slurm unreadable: {error}"
        self.picture = picture
        return picture, "ok"

    def report(self, picture: Picture | None, status: str) -> dict:
        """The heartbeat body: every registered node as Slurm last described it."""
        nodes = []
        if picture is not None:
            serving = _serving(picture.reservations)
            jobs_on = _outside_jobs(picture.jobs)
            reserved_for = {w.name: w for w in self.wanted}
            for node in picture.nodes:
                if node.name not in self.gpu_models:
                    continue
                if node.states <= {"UNKNOWN"}:
                    # a controller just restarted knows no node yet: say what it said before
                    down = self.last_down.get(node.name, "")
                else:
                    down = self.last_down[node.name] = _down_reason(node)
                nodes.append({
                    "hostname": node.name, "gpus": list(range(node.gpu_count)),
                    "down": down,
                    "busy": _busy(node, jobs_on.get(node.name, {}), picture.reservations,
                                  reserved_for),
                    "serving": sorted(serving.get(node.name, ())),
                })
        return {"fabric": self.options.fabric, "kind": "slurm", "status": status[:300],
                "nodes": nodes, "refused": self.refused}

    def beat(self) -> float:
        """One pass: read Slurm, report, make the reservations right. The delay to the next."""
        picture, status = self.read()
        try:
            answer = self.client.gateway_heartbeat(self.options.key, self.report(picture, status))
        except (Unreachable, ServerTrouble) as error:
            self.failures += 1
            log.warning("slurm: the report did not get through (%s); retrying", error)
            return retry_delay(self.interval_s, self.failures)
        self.failures = 0
        self.refused = []
        if not self.options.interval_s and answer.get("interval_s"):
            self.interval_s = max(float(answer["interval_s"]), 1.0)
        self.wanted = [Wanted.from_answer(item) for item in answer.get("reservations") or []]
        if picture is not None:
            self._register_new(picture, set(answer.get("unregistered") or ()))
        if status != "ok" or picture is None:
            log.warning("slurm: %s", status)
            return retry_delay(self.interval_s, 1)
        outcome = reconcile(self.scontrol, self.wanted, picture.reservations)
        self.refused = outcome.refused
        if not self.reconciled_once:
            self.reconciled_once = True
            log.info("slurm: reservations reconciled with IBEX after start: %s",
                     outcome.describe())
        elif outcome.changed or outcome.refused:
            log.info("slurm: reservations: %s", outcome.describe())
        return SOON_S if outcome.changed or outcome.refused else self.interval_s

    def run(self, duration_s: float | None = None) -> None:
        deadline = time.monotonic() + duration_s if duration_s else None
        self.setup()
        while not self.stop.is_set():
            try:
                delay = self.beat()
            except ApiError as error:
                if error.status in (401, 403):
                    raise
                log.warning("slurm: the server refused the report: %s", error)
                delay = self.interval_s
            if deadline is not None and time.monotonic() >= deadline:
                return
            self.stop.wait(delay)


def _fabric_name(node: dict) -> str:
    fabric = node.get("fabric")
    return str(fabric.get("name") if isinstance(fabric, dict) else fabric)


def _lease_of(reservation: str) -> str:
    return f"L-{reservation.removeprefix(PREFIX)}"


def _serving(reservations: list[SlurmReservation]) -> dict[str, set[str]]:
    """node -> the leases whose reservation Slurm holds on it."""
    serving: dict[str, set[str]] = {}
    for reservation in reservations:
        if reservation.name.startswith(PREFIX):
            for node in reservation.nodes:
                serving.setdefault(node, set()).add(_lease_of(reservation.name))
    return serving


def _outside_jobs(jobs: list[SlurmJob]) -> dict[str, dict[int, str]]:
    """node -> GPU index -> the running job outside IBEX reservations that holds it."""
    busy: dict[str, dict[int, str]] = {}
    for job in jobs:
        if job.state != "RUNNING" or job.reservation.startswith(PREFIX):
            continue
        for node, indexes in job.gpus.items():
            for index in indexes:
                busy.setdefault(node, {})[index] = f"job {job.job_id} of {job.user or 'a user'}"
    return busy


def _down_reason(node: SlurmNode) -> str:
    if node.available:
        return ""
    states = "+".join(sorted(node.states))
    return f"{states}: {node.reason}" if node.reason else states


def _busy(node: SlurmNode, jobs: dict[int, str], reservations: list[SlurmReservation],
          reserved_for: dict[str, Wanted]) -> list[dict]:
    """GPUs IBEX may not sell: held by jobs outside its reservations, in an active reservation
    that is not IBEX's, or on a node an IBEX reservation holds whole beyond its lease's GPUs."""
    why: dict[int, str] = dict(jobs)
    for reservation in reservations:
        if node.name not in reservation.nodes or reservation.state != "ACTIVE":
            continue
        if not reservation.name.startswith(PREFIX):
            for index in range(node.gpu_count):
                why.setdefault(index, f"in Slurm reservation {reservation.name}")
            continue
        want = reserved_for.get(reservation.name)
        leased = set(want.nodes.get(node.name, ())) if want else set(range(node.gpu_count))
        for index in range(node.gpu_count):
            if index not in leased:
                why.setdefault(index, f"on a node reservation {reservation.name} holds whole")
    return [{"index": i, "reason": reason[:300]} for i, reason in sorted(why.items())
            if i < node.gpu_count]

"""`ibex-agent fabric`: the fabric agent, beside the subnet manager.

Each interval it reads the fabric with infiniband-diags (``ibnetdiscover`` for the nodes and
the cables that are up, ``perfquery`` for every cabled port's counters) and posts a report
(`fabric.core.fabric_report`) to ``POST /api/v1/fabrics/<name>/reports/``. The topology goes
as a full snapshot whenever its hash differs from the one the server last acknowledged, the
counters every time.

A poll that cannot read the fabric (``ibnetdiscover`` fails or hangs: the simulator, the HCA or
the subnet manager is gone) is reported as ``reachable: false`` with the error and nothing else:
the server keeps its last view, and never reads a failed poll as every cable down.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from agent.client import ApiClient, ApiError, ServerTrouble, Unreachable
from agent.errors import AgentError
from fabric.core import partitions as partition_file
from fabric.core import qos as qos_core
from fabric.core.diags import (
    DiagsFormatError,
    Discovery,
    merge_counters,
    parse_discovery,
    parse_dump_fts,
    parse_ibqueryerrors,
    parse_linkinfo,
    parse_perfquery,
)
from fabric.core.fabric_report import (
    REPORT_VERSION,
    counters_entry,
    routes_hash,
    routes_section,
    topology_hash,
    topology_section,
)

log = logging.getLogger("ibex-agent")

DEFAULT_INTERVAL_S = 30.0
DEFAULT_COMMAND_TIMEOUT_S = 20.0
PERFQUERY_WORKERS = 4  # perfquery runs in parallel, one node (all its ports) per call
# Above this many nodes, two perfquery runs per node cost more than the interval (about 35 ms a
# run on a loaded 2-core machine: 140 s for 2,012 nodes); ibqueryerrors reads every port of the
# fabric in one run (docs/benchmarks.md).
PERFQUERY_MAX_NODES = 256
COUNTER_TOOLS = ("auto", "perfquery", "ibqueryerrors")
ERROR_THRESHOLDS = "SymbolErrorCounter=0\nLinkDownedCounter=0\nPortRcvErrors=0\nPortXmitDiscards=0\n"
ERROR_LENGTH = 500


class DiagsFailed(AgentError):
    """A diagnostic that did not answer: the fabric is not reachable from here."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(message)
        self.output = output  # what it printed on stdout before failing


@dataclass
class FabricAgentOptions:
    server: str
    token: str
    fabric: str
    interval_s: float = DEFAULT_INTERVAL_S
    opensm_conf_dir: Path | None = None
    opensm_pid_file: Path | None = None
    timeout_s: float = 10.0  # HTTP
    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    counters_tool: str = "auto"
    env: dict[str, str] | None = None  # for the diagnostics (None: this process's)


def run_diag(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run one diagnostic; its stdout, or DiagsFailed saying why not. A diagnostic that hangs
    (libibumad waiting on a port that never answers) is killed with its process group."""
    try:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=env, start_new_session=True)
    except OSError as error:
        raise DiagsFailed(f"{argv[0]}: {error.strerror or error}") from None
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise DiagsFailed(f"{argv[0]} gave no answer within {timeout_s:g} s") from None
    if process.returncode != 0:
        last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "")
        raise DiagsFailed(f"{argv[0]} failed (exit {process.returncode}): {last[:300]}", out)
    return out


@dataclass
class FabricReader:
    """Reads the fabric once: `read()` is a report without the server's part in it."""

    command_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    env: dict[str, str] | None = None
    counters_tool: str = "auto"  # perfquery per node; ibqueryerrors for the whole fabric
    run: Callable[[list[str], float, dict | None], str] = run_diag
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    discovery: Discovery | None = None  # the last poll's that reached the fabric
    routes: dict | None = None  # the last poll's routes section (None: not read)
    routes_error: str = ""

    def read(self) -> tuple[dict, dict | None]:
        """(the report's header and counters, its topology section or None when unreachable)."""
        started, observed_at = time.monotonic(), self.clock()
        header = {"version": REPORT_VERSION, "observed_at": observed_at.isoformat(),
                  "reachable": True, "error": ""}
        with tempfile.TemporaryDirectory(prefix="ibex-fabric-") as scratch:
            cache = Path(scratch, "fabric.cache")  # ibqueryerrors reads it: no second discovery
            try:
                discovery = parse_discovery(self.run(["ibnetdiscover", "--cache", str(cache)],
                                                     self.command_timeout_s, self.env))
                if not discovery.nodes:
                    raise DiagsFailed("ibnetdiscover found no nodes")
            except (DiagsFailed, DiagsFormatError) as error:
                header.update(reachable=False, error=str(error)[:ERROR_LENGTH], topology_hash="",
                              poll_s=round(time.monotonic() - started, 3))
                return header, None
            self.discovery = discovery
            states, state_error = self.read_port_states(discovery, cache)
            if self.tool_for(discovery) == "ibqueryerrors":
                counters, failures = self.read_fabric_counters(discovery, cache)
            else:
                counters, failures = self.read_counters(discovery)
            self.routes, self.routes_error = self.read_routes(discovery)
        section = topology_section(discovery, states)
        header.update(topology_hash=topology_hash(section), counters=counters,
                      poll_s=round(time.monotonic() - started, 3))
        if self.routes is not None:
            header["routes_hash"] = routes_hash(self.routes)
        elif self.routes_error:
            header["routes_error"] = self.routes_error
        if failures:
            header["counter_errors"] = failures[:20]
        if state_error:
            header["state_error"] = state_error
        return header, section

    def read_port_states(self, discovery: Discovery, cache: Path) -> tuple[dict, str]:
        """Each port's logical state from ``iblinkinfo`` over the discovery's cache (no MAD
        sent); without it every cable ibnetdiscover crossed counts as active, and why is said."""
        try:
            text = self.run(["iblinkinfo", "--load-cache", str(cache), "-l"],
                            self.command_timeout_s, self.env)
        except DiagsFailed as error:
            return {}, str(error)[:ERROR_LENGTH]
        return parse_linkinfo(text, discovery.port_guids), ""

    def read_routes(self, discovery: Discovery) -> tuple[dict | None, str]:
        """Every switch's unicast forwarding table in one ``dump_fts -n`` run (it needs LIDs:
        a subnet manager has run), with every node's LID: the report's ``routes``."""
        if not any(node.lid for node in discovery.nodes.values()):
            return None, "no LIDs yet: no subnet manager has swept the fabric"
        try:
            tables = parse_dump_fts(self.run(["dump_fts", "-n"], self.command_timeout_s,
                                             self.env))
        except (DiagsFailed, DiagsFormatError) as error:
            return None, str(error)[:ERROR_LENGTH]
        lids = {guid: node.lid for guid, node in discovery.nodes.items() if node.lid}
        return routes_section(tables, lids), ""

    def tool_for(self, discovery: Discovery) -> str:
        if self.counters_tool != "auto":
            return self.counters_tool
        return "perfquery" if len(discovery.nodes) <= PERFQUERY_MAX_NODES else "ibqueryerrors"

    def read_fabric_counters(self, discovery: Discovery, cache: Path) -> tuple[list[dict], list[str]]:
        """Every cabled port's counters in two ``ibqueryerrors`` runs over the discovery's cache:
        the data counters of every port (``--counters``), then every port with an error counter
        above zero (a threshold file of zeros); a port it does not list there has none."""
        thresholds = cache.with_name("thresholds")
        thresholds.write_text(ERROR_THRESHOLDS)
        base = ["ibqueryerrors", "--load-cache", str(cache)]
        try:
            data = parse_ibqueryerrors(self.run_listing([*base, "--counters"]), discovery.port_guids)
            errors = parse_ibqueryerrors(self.run_listing([*base, "--threshold-file", str(thresholds)]),
                                         discovery.port_guids)
        except (DiagsFailed, DiagsFormatError) as error:
            return [], [str(error)[:ERROR_LENGTH]]
        counters = []
        for guid, ports in discovery.cabled_ports().items():
            for port in ports:
                if (guid, port) not in data:
                    continue
                sample = {**errors.get((guid, port), {}), **data[(guid, port)]}
                counters.append(counters_entry(guid, port, {**sample, "extended": True}))
        return counters, []

    def run_listing(self, argv: list[str]) -> str:
        """ibqueryerrors exits 1 when it lists a port above a threshold: not a failure."""
        try:
            return self.run(argv, self.command_timeout_s, self.env)
        except DiagsFailed as error:
            if "(exit 1)" in str(error) and error.output:
                return error.output
            raise

    def read_counters(self, discovery: Discovery) -> tuple[list[dict], list[str]]:
        """Every cabled port's counters, one ``perfquery`` (and one ``perfquery -x``) per node,
        by LID: a node without a LID (no subnet manager has run) has no counters yet."""
        jobs = [(discovery.nodes[guid], ports)
                for guid, ports in discovery.cabled_ports().items()
                if guid in discovery.nodes and discovery.nodes[guid].lid]
        counters: list[dict] = []
        failures: list[str] = []
        with ThreadPoolExecutor(max_workers=PERFQUERY_WORKERS) as pool:
            for node, ports, result in pool.map(lambda job: (*job, self._node_counters(*job)), jobs):
                if isinstance(result, str):
                    failures.append(f"{node.guid}: {result}")
                    continue
                counters.extend(counters_entry(node.guid, port, result[port])
                                for port in ports if port in result)
        return counters, failures

    def _node_counters(self, node, ports: list[int]) -> dict[int, dict] | str:
        selector = [str(node.lid), ",".join(map(str, ports))]
        try:
            basic = parse_perfquery(self.run(["perfquery", *selector], self.command_timeout_s,
                                             self.env))
        except (DiagsFailed, DiagsFormatError) as error:
            return str(error)
        try:
            extended = parse_perfquery(self.run(["perfquery", "-x", *selector],
                                                self.command_timeout_s, self.env))
        except (DiagsFailed, DiagsFormatError):
            extended = {}  # no extended counters there: the 32-bit ones will do
        return {port: merge_counters(sample, extended.get((lid, port)))
                for (lid, port), sample in basic.items()}


def subnet_manager_section(conf_dir: Path | None, pid_file: Path | None) -> dict | None:
    """Whether the OpenSM the agent was pointed at runs (its pid file names a live process)."""
    if conf_dir is None and pid_file is None:
        return None
    section: dict = {"conf_dir": str(conf_dir) if conf_dir else ""}
    if pid_file is not None:
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, 0)
            section.update(running=True, pid=pid)
        except (OSError, ValueError, IndexError):
            section.update(running=False, pid=None)
    return section


PARTITIONS_FILE = "partitions.conf"


@dataclass
class PartitionsWritten:
    changed: bool  # the file's content changed (and so was written)
    signalled: bool  # OpenSM was sent SIGHUP
    partitions: int
    missing: list[str]  # member ports not in the discovery (cable down): left out
    error: str = ""


def read_partitions_file(conf_dir: Path) -> str:
    try:
        return (conf_dir / PARTITIONS_FILE).read_text()
    except FileNotFoundError:
        return ""


def write_partitions_file(conf_dir: Path, partitions: list[dict],
                          port_guid: Callable[[str, int], str | None],
                          pid_file: Path | None, *, notify: bool = True) -> PartitionsWritten:
    """Write IBEX's block of ``DIR/partitions.conf`` (the provider's lines kept as they are)
    atomically: a temporary file in the same directory, renamed over the old one, so OpenSM
    never reads half a file. Only when the content changes is the file written and OpenSM
    (the pid in `pid_file`) sent SIGHUP, on which it re-reads it and re-programs the ports
    (`notify=False`: the caller signals once for every file it wrote)."""
    current = read_partitions_file(conf_dir)
    lines, missing = partition_file.block(partitions, port_guid)
    text = partition_file.render(current, lines)
    if text == current:
        return PartitionsWritten(False, False, len(partitions), missing)
    write_atomically(conf_dir / PARTITIONS_FILE, text)
    if not notify:
        return PartitionsWritten(True, False, len(partitions), missing)
    signalled, error = signal_opensm(pid_file, PARTITIONS_FILE)
    return PartitionsWritten(True, signalled, len(partitions), missing, error)


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` by a synced temporary file in the same directory renamed over it: a
    reader sees the old content or the new, never half; a failed write leaves the old file."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def signal_opensm(pid_file: Path | None, what: str) -> tuple[bool, str]:
    """SIGHUP to OpenSM (the pid in `pid_file`): it re-reads opensm.conf, partitions.conf and
    qos-policy.conf and sweeps. (signalled, why not)."""
    if pid_file is None:
        return False, f"no --opensm-pid-file: OpenSM was not told to re-read {what}"
    try:
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGHUP)
        return True, ""
    except (OSError, ValueError, IndexError) as exc:
        return False, f"OpenSM not signalled ({pid_file}): {exc}"


OPENSM_CONF = "opensm.conf"
QOS_POLICY_FILE = "qos-policy.conf"


@dataclass
class QosWritten:
    changed: bool  # opensm.conf's QoS options or qos-policy.conf changed (and were written)
    signalled: bool
    pkeys: int  # partitions mapped to their class's SL
    error: str = ""


def write_qos_files(conf_dir: Path, qos: dict, pid_file: Path | None, *,
                    notify: bool = True) -> QosWritten:
    """The bandwidth classes (the server's `qos`): ``DIR/qos-policy.conf`` maps each lease's
    P_Key to its class's SL, and ``DIR/opensm.conf`` (the file OpenSM was started with) gets the
    QoS options (`qos TRUE`, the VL-arbitration tables, the SL2VL map) and `qos_policy_file`
    pointing at that policy; its other lines are kept byte for byte. Each file is written
    atomically and only when its content changes; then OpenSM is sent SIGHUP, on which it
    re-reads both and re-programs every port's tables."""
    pkeys = [(entry["pkey"], entry["sl"]) for entry in qos.get("pkeys", [])]
    conf_path = conf_dir / OPENSM_CONF
    try:
        conf = conf_path.read_text()
    except FileNotFoundError:
        return QosWritten(False, False, len(pkeys), f"no {conf_path}: start OpenSM with "
                          f"`opensm -F {conf_path}` for IBEX's bandwidth classes")
    changed = False
    policy = qos_core.policy_text(qos["default_sl"], pkeys)
    policy_path = conf_dir / QOS_POLICY_FILE
    try:
        old_policy = policy_path.read_text()
    except FileNotFoundError:
        old_policy = None
    if policy != old_policy:
        write_atomically(policy_path, policy)
        changed = True
    new_conf = qos_core.render_opensm_conf(
        conf, {**qos["options"], "qos_policy_file": str(policy_path)})
    if new_conf != conf:
        write_atomically(conf_path, new_conf)
        changed = True
    if not changed or not notify:
        return QosWritten(changed, False, len(pkeys))
    signalled, error = signal_opensm(pid_file, f"{OPENSM_CONF} and {QOS_POLICY_FILE}")
    return QosWritten(True, signalled, len(pkeys), error)


class FabricAgent:
    def __init__(self, options: FabricAgentOptions, client: ApiClient | None = None,
                 reader: FabricReader | None = None, stop: threading.Event | None = None):
        self.options = options
        self.client = client or ApiClient(options.server, timeout_s=options.timeout_s)
        self.reader = reader or FabricReader(command_timeout_s=options.command_timeout_s,
                                             env=options.env, counters_tool=options.counters_tool)
        self.stop = stop or threading.Event()
        self.acknowledged_hash: str | None = None  # the topology the server holds
        self.acknowledged_routes: str | None = None  # the routes the server holds
        self.partitions_written: PartitionsWritten | None = None  # the last poll's
        self.qos_written: QosWritten | None = None  # the last poll's

    def poll_once(self) -> dict:
        """Read the fabric and report it; the server's answer."""
        report, topology = self.reader.read()
        sm = subnet_manager_section(self.options.opensm_conf_dir, self.options.opensm_pid_file)
        if sm is not None:
            report["subnet_manager"] = sm
        conf_dir = self.options.opensm_conf_dir
        if conf_dir is not None:
            report["provider_pkeys"] = [
                f"{key:#06x}" for key in partition_file.provider_pkeys(read_partitions_file(conf_dir))]
        routes = getattr(self.reader, "routes", None) if report["reachable"] else None
        send_topology = topology is not None and report["topology_hash"] != self.acknowledged_hash
        send_routes = routes is not None and report.get("routes_hash") != self.acknowledged_routes
        answer = self.client.fabric_report(self.options.token, self.options.fabric, {
            **report, **(topology if send_topology else {}),
            **({"routes": routes} if send_routes else {})})
        lost_topology = topology is not None and answer.get("topology_hash") != report["topology_hash"]
        lost_routes = routes is not None and answer.get("routes_hash") != report.get("routes_hash")
        if (lost_topology and not send_topology) or (lost_routes and not send_routes):
            # the server lost our topology or routes (the fabric was re-imported): send again
            answer = self.client.fabric_report(self.options.token, self.options.fabric, {
                **report, **(topology or {}), **({"routes": routes} if routes else {})})
        if report["reachable"]:
            self.acknowledged_hash = answer.get("topology_hash")
            self.acknowledged_routes = answer.get("routes_hash")
        discovery = getattr(self.reader, "discovery", None)
        if conf_dir is not None and "partitions" in answer and discovery is not None:
            self.apply(conf_dir, answer, discovery)
        return answer

    def apply(self, conf_dir: Path, answer: dict, discovery: Discovery) -> None:
        """Write what the server answered into OpenSM's files, partitions first (the QoS
        policy names their P_Keys), then one SIGHUP if anything changed."""
        partitions = write_partitions_file(
            conf_dir, answer["partitions"],
            lambda guid, port: discovery.ca_ports.get((guid, port)),
            self.options.opensm_pid_file, notify=False)
        qos = write_qos_files(conf_dir, answer["qos"], self.options.opensm_pid_file,
                              notify=False) if "qos" in answer else None
        signalled, error = False, ""
        if partitions.changed or (qos is not None and qos.changed):
            written = [name for name, done in ((PARTITIONS_FILE, partitions.changed),
                                               ("the QoS files", qos and qos.changed)) if done]
            signalled, error = signal_opensm(self.options.opensm_pid_file, " and ".join(written))
        self.partitions_written = replace(partitions, signalled=signalled and partitions.changed,
                                          error=error if partitions.changed else "")
        if qos is not None:
            self.qos_written = replace(qos, signalled=signalled and qos.changed,
                                       error=qos.error or (error if qos.changed else ""))
        for problem in {self.partitions_written.error,
                        self.qos_written.error if qos is not None else ""} - {""}:
            log.warning("%s: %s", self.options.fabric, problem)

    def run_forever(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                answer = self.poll_once()
                links = answer.get("links", {})
                log.info("%s: reported (%s); links %s active, %s down", self.options.fabric,
                         "reachable" if answer.get("reachable") else "fabric unreachable",
                         links.get("active", "?"), links.get("down", "?"))
                written = self.partitions_written
                if written is not None and written.changed:
                    log.info("%s: partitions.conf written (%d partitions)%s", self.options.fabric,
                             written.partitions, "; OpenSM signalled" if written.signalled else "")
                if written is not None and written.missing:
                    log.warning("%s: member ports not seen, left out of their partitions: %s",
                                self.options.fabric, ", ".join(written.missing[:10]))
            except ApiError as error:
                if error.status in (401, 403, 404):
                    raise
                log.warning("%s: report refused: %s", self.options.fabric, error)
            except (Unreachable, ServerTrouble) as error:
                log.warning("%s: %s; trying again next interval", self.options.fabric, error)
            self.stop.wait(max(0.0, self.options.interval_s - (time.monotonic() - started)))

"""`ibex-agent simulate`: register many simulated hosts and heartbeat them all from one process.

Heartbeats go out from a pool of threads, one `requests.Session` per thread (keep-alive).
Each host is due again `interval_s` after its last heartbeat finished (later after failures);
a small scheduler loop hands due hosts to the pool, so one host is never in flight twice.
"""

import heapq
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

from agent.client import BULK_LIMIT, ApiClient, ApiError, ServerTrouble, Unreachable
from agent.errors import AgentError
from agent.heartbeat import heartbeat_body, parse_answer, retry_delay
from agent.node import DEFAULT_INTERVAL_S, FATAL_STATUSES
from agent.registration import from_answer, pick_node, rotate_existing
from agent.simulated import ControlFile, SimulatedHost

log = logging.getLogger("ibex-agent")

SCHEDULER_TICK_S = 0.05


@dataclass
class FleetOptions:
    api: str
    key: str
    fabric: str
    hostnames: list[str]
    gpu_model: str
    gpus: int = 8
    interval_s: float | None = None  # None: what the server said at registration
    cpu_cores: int = 128
    memory_gib: int = 2048
    workers: int = 16
    seed: int = 0
    control_path: Path | None = None
    duration_s: float | None = None
    timeout_s: float = 10.0
    bulk_size: int = BULK_LIMIT
    runtime: str = "process"  # what the hosts report: "process" pretends to run workloads, or "none"


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    held_back: int = 0  # hosts in stop_heartbeats, which sent nothing


class Fleet:
    def __init__(self, options: FleetOptions, stop: threading.Event | None = None) -> None:
        self.options = options
        self.stop = stop or threading.Event()
        self.reload_control = threading.Event()  # set by SIGUSR1
        self.hosts = [
            SimulatedHost(name, options.gpu_model, options.gpus, options.seed) for name in options.hostnames
        ]
        self.control = ControlFile(options.control_path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self.period = Tally()
        self.total = Tally()
        self._known_nodes: dict[str, int] | None = None  # the provider's nodes, after a 409

    # one keep-alive session per thread

    def client(self) -> ApiClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = ApiClient(self.options.api, requests.Session(), self.options.timeout_s)
            self._local.client = client
        return client

    # registration

    def register_all(self, pool: ThreadPoolExecutor) -> None:
        for chunk in _chunks(self.hosts, self.options.bulk_size):
            if self.stop.is_set():
                return
            self._register_chunk(chunk, pool)
        log.info("simulate: %d hosts registered in fabric %s", len(self.hosts), self.options.fabric)

    def _register_chunk(self, chunk: list[SimulatedHost], pool: ThreadPoolExecutor) -> None:
        """Bulk-register; hosts the provider already has (409) get a rotated token instead."""
        pending = {host.hostname: host for host in chunk}
        for _attempt in range(3):
            if not pending:
                return
            specs = [host.registration(self.options.fabric, self.options.cpu_cores, self.options.memory_gib)
                     for host in pending.values()]
            try:
                answers = self.client().register_nodes(self.options.key, specs)
            except ApiError as error:
                if error.status != 409:
                    raise
                if self._known_nodes is None:  # listed once per run, not once per chunk
                    self._known_nodes = self._provider_nodes()
                known = self._known_nodes
                existing = {name: known.get(name) for name in pending if name in known}
                existing.update({name: None for name in _named_hosts(error, list(pending))
                                 if name not in existing})
                if not existing:
                    raise
                self._rotate(existing, pending, pool)
                continue
            self._take_answers(list(pending.values()), answers)
            return
        raise AgentError(f"could not register {len(pending)} hosts after 3 tries (they keep conflicting)")

    def _take_answers(self, hosts: list[SimulatedHost], answers: list[dict]) -> None:
        """Give each host its id and token: matched by hostname, else by order in the request."""
        if len(answers) != len(hosts):
            raise ServerTrouble(f"the bulk answer has {len(answers)} nodes for {len(hosts)} sent")
        by_name = {str(answer.get("hostname")): answer for answer in answers}
        if set(by_name) == {host.hostname for host in hosts}:
            answers = [by_name[host.hostname] for host in hosts]
        for host, answer in zip(hosts, answers, strict=True):
            registered = from_answer(answer, host.hostname)
            host.node_id, host.token = registered.node_id, registered.token
            host.interval_s = self._initial_interval(registered.interval_s)

    def _provider_nodes(self) -> dict[str, int]:
        """hostname -> node id for every live node the provider has."""
        by_hostname: dict[str, list[dict]] = {}
        for node in self.client().list_nodes(self.options.key):
            by_hostname.setdefault(str(node.get("hostname")), []).append(node)
        known = {}
        for hostname, entries in by_hostname.items():
            node_id = pick_node(entries, hostname, self.options.fabric)
            if node_id is not None:
                known[hostname] = node_id
        return known

    def _rotate(self, existing: dict[str, int | None], pending: dict[str, SimulatedHost],
                pool: ThreadPoolExecutor) -> None:
        def rotate(name: str) -> None:
            registered = rotate_existing(self.client(), self.options.key, name, self.options.fabric,
                                          existing[name])
            host = pending[name]
            host.node_id, host.token = registered.node_id, registered.token
            host.interval_s = self._initial_interval(None)

        for _ in pool.map(rotate, list(existing)):
            pass
        for name in existing:
            pending.pop(name)
        log.info("simulate: %d of these hosts were already registered; rotated their tokens", len(existing))

    def _initial_interval(self, from_server: float | None) -> float:
        return self.options.interval_s or from_server or DEFAULT_INTERVAL_S

    # heartbeats

    def beat(self, host: SimulatedHost) -> float | None:
        """One heartbeat for `host`; the delay until its next one, or None if it is done."""
        control = self.control.current
        if host.hostname in control.stop_heartbeats:
            self._count("held_back")
            return host.interval_s
        pretend = self.options.runtime == "process"
        body = heartbeat_body(
            host.sample(control), host.ib_ports(), host.leases,
            runtime={"kind": self.options.runtime, "address": host.hostname, "ssh_port": None},
            workloads=host.workload_reports() if pretend else None,
            devices=host.parts.reports(),
        )
        try:
            answer = parse_answer(self.client().heartbeat(host.node_id, host.token, body))
        except ApiError as error:
            if error.status in FATAL_STATUSES:
                host.stopped = True
                log.warning("%s: %s; stopping this node", host.hostname, error)
                self._count("failed")
                return None
            return self._failed(host, error, backoff=False)
        except (Unreachable, ServerTrouble) as error:
            return self._failed(host, error, backoff=True)
        if host.failures:
            log.info("%s: heartbeats get through again", host.hostname)
        host.failures = 0
        host.leases.apply(answer.actions, host.hostname)
        host.parts.apply(answer.actions, host.hostname)
        host.parts.release()  # nothing to destroy: a stopped lease's parts go at once
        if pretend:
            host.apply_workloads(answer.actions)
            self._ship_logs(host)
        if answer.interval_s and answer.interval_s > 0:
            host.interval_s = answer.interval_s
        self._count("ok")
        return host.interval_s

    def _ship_logs(self, host: SimulatedHost) -> None:
        """The pretended workloads' new log lines, in this heartbeat's thread (no thread per host)."""
        for workload, body in host.logs_to_ship():
            try:
                self.client().post_logs(host.node_id, host.token, body)
            except ApiError as error:
                log.warning("%s: the server refuses lease %s's log: %s", host.hostname, workload.lease, error)
            except (Unreachable, ServerTrouble):
                return  # kept for the next heartbeat
            host.shipped(workload, len(body["lines"]))

    def _failed(self, host: SimulatedHost, error: AgentError, backoff: bool) -> float:
        # one line when a host starts failing, not one per failed heartbeat
        if host.failures == 0:
            log.warning("%s: heartbeat failed: %s; retrying with backoff", host.hostname, error)
        host.failures += 1
        self._count("failed")
        return retry_delay(host.interval_s, host.failures if backoff else 0)

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self.period, what, getattr(self.period, what) + 1)
            setattr(self.total, what, getattr(self.total, what) + 1)

    def run(self) -> None:
        """Register every host, then heartbeat until stopped or `duration_s` has passed."""
        started = time.monotonic()
        deadline = started + self.options.duration_s if self.options.duration_s else None
        self._refresh_control(force=True)
        pool = ThreadPoolExecutor(max_workers=self.options.workers, thread_name_prefix="heartbeat")
        try:
            self.register_all(pool)
            self._heartbeat_loop(pool, deadline)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        elapsed = time.monotonic() - started
        log.info("simulate: stopped after %.1f s: %d heartbeats ok, %d failed",
                 elapsed, self.total.ok, self.total.failed)
        if self.hosts and all(host.stopped for host in self.hosts):
            raise AgentError("the server refused every simulated node's token")

    def _heartbeat_loop(self, pool: ThreadPoolExecutor, deadline: float | None) -> None:
        now = time.monotonic()
        due: list[tuple[float, int]] = [(now, i) for i in range(len(self.hosts))]
        finished: queue.SimpleQueue[tuple[float, int]] = queue.SimpleQueue()
        next_summary = now + self._summary_every()

        def work(i: int) -> None:
            try:
                delay = self.beat(self.hosts[i])
            except Exception:  # a bug must not silently stop a host: log it, keep the host going
                log.exception("%s: unexpected error in heartbeat", self.hosts[i].hostname)
                delay = self.hosts[i].interval_s
            if delay is not None:
                finished.put((time.monotonic() + delay, i))

        while not self.stop.is_set():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return
            if self.reload_control.is_set():
                self.reload_control.clear()
                self._refresh_control(force=True)
            else:
                self._refresh_control()
            while not finished.empty():
                heapq.heappush(due, finished.get())
            while due and due[0][0] <= now:
                pool.submit(work, heapq.heappop(due)[1])
            if now >= next_summary:
                self._log_summary()
                next_summary = now + self._summary_every()
            if not due and all(host.stopped for host in self.hosts):
                return
            self.stop.wait(SCHEDULER_TICK_S)

    def _refresh_control(self, force: bool = False) -> None:
        try:
            if self.control.refresh(force):
                control = self.control.current
                log.info("simulate: control file: failed GPUs %s, degraded GPUs %s, stopped hosts %s",
                         _describe(control.fail_gpus), _describe(control.degrade_gpus),
                         ", ".join(sorted(control.stop_heartbeats)) or "none")
        except AgentError as error:
            log.warning("%s; keeping the previous control", error)

    def _summary_every(self) -> float:
        return max(self.options.interval_s or DEFAULT_INTERVAL_S, 5.0)

    def _log_summary(self) -> None:
        with self._lock:
            period, self.period = self.period, Tally()
        live = sum(not host.stopped for host in self.hosts)
        log.info("simulate: %d live nodes: %d heartbeats ok, %d failed, %d held back by control",
                 live, period.ok, period.failed, period.held_back)


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _named_hosts(error: ApiError, names: list[str]) -> list[str]:
    """Hostnames a bulk 409 names by field keys like `nodes.3.hostname`."""
    named = []
    for key in error.fields:
        parts = key.split(".")
        if len(parts) >= 2 and parts[0] == "nodes" and parts[1].isdigit() and int(parts[1]) < len(names):
            named.append(names[int(parts[1])])
    return named


def _describe(gpus: dict[str, frozenset[int]]) -> str:
    return ", ".join(f"{host}:{sorted(indexes)}" for host, indexes in sorted(gpus.items())) or "none"

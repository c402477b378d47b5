"""`ibex-agent run`: heartbeat one real node, obey the answer's actions, back off on trouble.

With a runtime (`--runtime process|ssh`) two more threads run beside the heartbeats: one
watches the leases' processes (ends, SIGKILL deadlines, cleanup) every half second, one ships
their logs every second. Neither waits on the other, so a held heartbeat delays nothing.
"""

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from agent.client import ApiClient, ApiError, ServerTrouble, Unreachable
from agent.errors import AgentError
from agent.heartbeat import Answer, GpuSample, Leases, heartbeat_body, parse_answer, retry_delay
from agent.logship import LogShipper
from agent.parts import Enforcer, NodeEnforcer, PartsManager
from agent.state import NodeState, save_state
from agent.workloads import Runtime

log = logging.getLogger("ibex-agent")

DEFAULT_INTERVAL_S = 15.0
MAX_WAIT_S = 30  # the most `wait_s` the server takes
TICK_S = 0.5
SHIP_EVERY_S = 1.0
# answers that mean this node will never be heard again without a new registration
FATAL_STATUSES = (401, 403, 404)


class NodeAgent:
    def __init__(
        self,
        client: ApiClient,
        state: NodeState,
        state_path: Path,
        read_gpus: Callable[[], list[GpuSample]],
        read_ib_ports: Callable[[], list[dict]],
        interval_s: float | None = None,
        stop: threading.Event | None = None,
        runtime: Runtime | None = None,
        shipper: LogShipper | None = None,
        enforcer: Enforcer | None = None,
    ) -> None:
        self.client = client
        self.state = state
        self.state_path = state_path
        self.read_gpus = read_gpus
        self.read_ib_ports = read_ib_ports
        self.interval_s = interval_s or state.heartbeat_interval_s or DEFAULT_INTERVAL_S
        self.stop = stop or threading.Event()
        self.leases = Leases(serving=dict(state.serving))
        self.node_state: str | None = None
        self.runtime = runtime
        self.shipper = shipper
        self.news = False  # the last answer changed what we report
        # one lock for the state file and the runtime's records, whichever thread saves
        self.lock = runtime.lock if runtime else threading.RLock()
        if runtime:
            runtime.save = self.save
        if runtime and shipper:
            runtime.log_drained = shipper.drained
        # MIG slices and shares; without an enforcer, slices are reported as not made
        # (the runtime's lock: its thread saves the parts, the heartbeat asks it what runs)
        self.parts = PartsManager(enforcer or NodeEnforcer(None), state.parts, self.save, self.lock)
        if runtime:
            runtime.devices_for = self.parts.devices_for
            runtime.mps_pipe_directory = self.parts.enforcer.mps_pipe_directory()

    def wait_s(self) -> int:
        """How long the server may hold the answer: the interval (the held answer is the wait)."""
        return int(min(MAX_WAIT_S, self.interval_s))

    def beat(self, hold: bool = False) -> Answer:
        """Send one heartbeat and obey its answer; raises AgentError subclasses on failure.

        `hold`: send `wait_s`, letting the server hold the answer until there is work."""
        gpus = self.read_gpus()
        runtime = self.runtime
        if runtime:
            runtime.gpus_on_node = len(gpus)
        self.parts.release(self._busy)
        body = heartbeat_body(
            gpus, self.read_ib_ports(), self.leases,
            runtime=runtime.descriptor() if runtime else None,
            workloads=runtime.reports() if runtime else None,
            wait_s=self.wait_s() if hold else None,
            also_serving=(runtime.tearing_down() if runtime else set()) | self.parts.tearing_down(),
            devices=self.parts.reports(),
        )
        answer = parse_answer(self.client.heartbeat(self.state.node_id, self.state.token, body))
        who = self.state.hostname
        leases_changed = self.leases.apply(answer.actions, who)
        # parts first: the runtime starts the lease's command on them
        parts_changed = self.parts.apply(answer.actions, who)
        launched = runtime.apply(answer.actions) if runtime else False
        parts_changed |= self.parts.release(self._busy)  # e.g. no command ran: at once
        # news the server waits for (what we serve, a generation, rank 0's port, the
        # devices of a lease's parts): tell it now
        self.news = leases_changed or launched or parts_changed
        if answer.interval_s and answer.interval_s > 0 and answer.interval_s != self.interval_s:
            log.info("%s: heartbeat interval is now %g s", who, answer.interval_s)
            self.interval_s = answer.interval_s
        if answer.node_state and answer.node_state != self.node_state:
            log.info("%s: node %d is %s", who, self.state.node_id, answer.node_state)
            self.node_state = answer.node_state
        if leases_changed:
            self.save()
        return answer

    def _busy(self, lease: str) -> bool:
        """Whether a lease's processes may still run on its GPU parts."""
        return self.runtime.holds(lease) if self.runtime else False

    def save(self) -> None:
        with self.lock:
            self.state.serving = dict(self.leases.serving)
            if self.runtime:
                self.state.workloads = self.runtime.snapshot()
            self.state.parts = self.parts.snapshot()
            save_state(self.state_path, self.state)

    def run_forever(self) -> None:
        """Heartbeat until stopped; returns on stop, raises ApiError when the node is refused.

        Each heartbeat goes `interval` after the previous one was sent: right away after an
        answer the server held that long, and right away after an answer that changed what we
        report (a lease started or stopped, a command launched), so that, e.g., the other ranks
        learn rank 0's port without waiting an interval. A repeated action changes nothing, so
        a server repeating `stop` does not make the agent spin."""
        helpers = self._start_helpers()
        try:
            self._heartbeat_loop()
        finally:
            self.stop.set()
            for helper in helpers:
                helper.join()

    def _heartbeat_loop(self) -> None:
        failures = 0
        while not self.stop.is_set():
            sent_at = time.monotonic()
            try:
                self.beat(hold=True)
                failures = 0
                delay = 0.0 if self.news else max(0.0, self.interval_s - (time.monotonic() - sent_at))
            except ApiError as error:
                if error.status in FATAL_STATUSES:
                    raise
                log.warning("%s: heartbeat refused: %s", self.state.hostname, error)
                delay = self.interval_s  # a 4xx will not get better by hammering
            except (Unreachable, ServerTrouble) as error:
                failures += 1
                delay = retry_delay(self.interval_s, failures)
                log.warning("%s: heartbeat failed: %s; retrying in %g s", self.state.hostname, error, delay)
            except AgentError as error:  # e.g. the state file could not be written
                log.warning("%s: %s", self.state.hostname, error)
                delay = retry_delay(self.interval_s, failures)
            self.stop.wait(delay)

    def _start_helpers(self) -> list[threading.Thread]:
        helpers = []
        if self.runtime and self.runtime.runs_commands:
            helpers.append(_every(TICK_S, self.runtime.tick, self.stop, "workloads"))
        if self.shipper:
            helpers.append(_every(SHIP_EVERY_S, self.shipper.ship_all, self.stop, "logs"))
        return helpers


def _every(period_s: float, work: Callable[[], None], stop: threading.Event, name: str) -> threading.Thread:
    """A thread doing `work` every `period_s` until `stop`; a failure is logged, never fatal."""
    def loop() -> None:
        while not stop.is_set():
            try:
                work()
            except AgentError as error:
                log.warning("%s: %s", name, error)
            except Exception:  # a bug must not silently stop the watching: say so, go on
                log.exception("%s: unexpected error", name)
            stop.wait(period_s)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    return thread

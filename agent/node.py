"""`ibex-agent run`: heartbeat one real node, obey the answer's actions, back off on trouble."""

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from agent.client import ApiClient, ApiError, ServerTrouble, Unreachable
from agent.errors import AgentError
from agent.heartbeat import Answer, GpuSample, Leases, heartbeat_body, parse_answer, retry_delay
from agent.state import NodeState, save_state

log = logging.getLogger("ibex-agent")

DEFAULT_INTERVAL_S = 15.0
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

    def beat(self) -> Answer:
        """Send one heartbeat and obey its answer; raises AgentError subclasses on failure."""
        body = heartbeat_body(self.read_gpus(), self.read_ib_ports(), self.leases)
        answer = parse_answer(self.client.heartbeat(self.state.node_id, self.state.token, body))
        who = self.state.hostname
        leases_changed = self.leases.apply(answer.actions, who)
        if answer.interval_s and answer.interval_s > 0 and answer.interval_s != self.interval_s:
            log.info("%s: heartbeat interval is now %g s", who, answer.interval_s)
            self.interval_s = answer.interval_s
        if answer.node_state and answer.node_state != self.node_state:
            log.info("%s: node %d is %s", who, self.state.node_id, answer.node_state)
            self.node_state = answer.node_state
        if leases_changed:
            self.state.serving = dict(self.leases.serving)
            save_state(self.state_path, self.state)
        return answer

    def run_forever(self) -> None:
        """Heartbeat until stopped; returns on stop, raises ApiError when the node is refused."""
        failures = 0
        while not self.stop.is_set():
            try:
                self.beat()
                failures = 0
            except ApiError as error:
                if error.status in FATAL_STATUSES:
                    raise
                failures = 0  # a 4xx will not get better by hammering; keep the normal pace
                log.warning("%s: heartbeat refused: %s", self.state.hostname, error)
            except (Unreachable, ServerTrouble) as error:
                failures += 1
                delay = retry_delay(self.interval_s, failures)
                log.warning("%s: heartbeat failed: %s; retrying in %g s", self.state.hostname, error, delay)
            except AgentError as error:  # e.g. the state file could not be written
                log.warning("%s: %s", self.state.hostname, error)
            self.stop.wait(retry_delay(self.interval_s, failures))

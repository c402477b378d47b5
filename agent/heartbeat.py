"""What a heartbeat says and what its answer asks: GPU samples, leases served, actions, backoff."""

import logging
from dataclasses import asdict, dataclass, field

from agent.client import ServerTrouble

log = logging.getLogger("ibex-agent")

MAX_BACKOFF_S = 60.0


@dataclass
class GpuSample:
    index: int
    temperature_c: int
    utilization_pct: int
    memory_used_mib: int
    ecc_errors: int
    xid_errors: int


@dataclass
class Action:
    action: str  # "start" or "stop"
    lease: str
    gpus: list[int]


@dataclass
class Answer:
    interval_s: float | None
    node_state: str | None
    actions: list[Action] = field(default_factory=list)


@dataclass
class Leases:
    """The leases this node serves: lease id -> GPU indexes. Obeys start/stop actions."""

    serving: dict[str, list[int]] = field(default_factory=dict)

    def apply(self, actions: list[Action], who: str) -> bool:
        """Obey the actions; True if what we serve changed."""
        changed = False
        for action in actions:
            if action.action == "start":
                if self.serving.get(action.lease) != action.gpus:
                    self.serving[action.lease] = list(action.gpus)
                    changed = True
                    log.info("%s: start serving lease %s on GPUs %s", who, action.lease, action.gpus)
            elif action.action == "stop":
                if self.serving.pop(action.lease, None) is not None:
                    changed = True
                    log.info("%s: stop serving lease %s", who, action.lease)
            else:
                log.warning("%s: ignoring unknown action %r for lease %s", who, action.action, action.lease)
        return changed

    def lease_ids(self) -> list[str]:
        return sorted(self.serving)

    def busy_gpus(self) -> set[int]:
        return {index for gpus in self.serving.values() for index in gpus}


def heartbeat_body(gpus: list[GpuSample], ib_ports: list[dict], leases: Leases) -> dict:
    return {
        "gpus": [asdict(sample) for sample in gpus],
        "ib_ports": ib_ports,
        "serving": leases.lease_ids(),
    }


def parse_answer(data: dict) -> Answer:
    """Read the heartbeat answer; a malformed one is server trouble, never a crash."""
    try:
        interval = data.get("interval_s")
        actions = [
            Action(
                action=str(item["action"]),
                lease=str(item["lease"]),
                gpus=[int(index) for index in item.get("gpus") or []],
            )
            for item in data.get("actions") or []
        ]
        return Answer(
            interval_s=float(interval) if interval is not None else None,
            node_state=data.get("node_state"),
            actions=actions,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ServerTrouble("the heartbeat answer is malformed") from None


def retry_delay(interval_s: float, failures: int) -> float:
    """After `failures` failed heartbeats in a row: the interval, doubled each time, capped at 60 s.

    The cap never shortens an interval the server asked for that is already above 60 s.
    """
    if failures <= 0:
        return interval_s
    return min(interval_s * 2**failures, max(MAX_BACKOFF_S, interval_s))

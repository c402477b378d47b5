"""What a heartbeat says and what its answer asks: GPU samples, leases served, actions, backoff."""

import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from agent.client import ServerTrouble
from agent.launch import Launch, parse_launch
from agent.parts import Part, parse_parts

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
    action: str  # "start", "notice" or "stop"
    lease: str
    gpus: list[int]
    launch: Launch | None = None  # start: what to run, as docs/workloads.md says
    until: datetime | None = None  # notice: SIGKILL at this instant
    grace_s: float | None = None  # stop: seconds between SIGTERM and SIGKILL
    parts: list[Part] | None = None  # start: MIG slices and shares; None: whole GPUs


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
            elif action.action == "notice":
                pass  # only a runtime acts on a notice; the lease is still served
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


def heartbeat_body(
    gpus: list[GpuSample],
    ib_ports: list[dict],
    leases: Leases,
    runtime: dict | None = None,
    workloads: list[dict] | None = None,
    wait_s: int | None = None,
    also_serving: set[str] | frozenset[str] = frozenset(),
    devices: dict[str, list[dict]] | None = None,
) -> dict:
    """The heartbeat body; `also_serving` are leases still being torn down (kept in `serving`
    until their processes and GPU parts are gone, as the server expects); `devices` the
    parts of the leases served with parts (left out when there are none)."""
    body: dict = {
        "gpus": [asdict(sample) for sample in gpus],
        "ib_ports": ib_ports,
        "serving": sorted(set(leases.lease_ids()) | set(also_serving)),
    }
    if runtime is not None:
        body["runtime"] = runtime
    if workloads is not None:
        body["workloads"] = workloads
    if wait_s is not None:
        body["wait_s"] = wait_s
    if devices:
        body["devices"] = devices
    return body


def parse_answer(data: dict) -> Answer:
    """Read the heartbeat answer; a malformed one is server trouble, never a crash."""
    try:
        interval = data.get("interval_s")
        actions = [_action(item) for item in data.get("actions") or []]
        return Answer(
            interval_s=float(interval) if interval is not None else None,
            node_state=data.get("node_state"),
            actions=actions,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ServerTrouble("the heartbeat answer is malformed") from None


def _action(item: dict) -> Action:
    launch = item.get("launch")
    until = item.get("until")
    grace_s = item.get("grace_s")
    parts = item.get("parts")
    return Action(
        action=str(item["action"]),
        lease=str(item["lease"]),
        gpus=[int(index) for index in item.get("gpus") or []],
        launch=parse_launch(launch) if launch is not None else None,
        until=parse_instant(until) if until is not None else None,
        grace_s=max(0.0, float(grace_s)) if grace_s is not None else None,
        parts=parse_parts(parts) if parts is not None else None,
    )


def parse_instant(text: str) -> datetime:
    """An ISO 8601 instant (`Z` or an offset; none means UTC); ValueError if it is not one."""
    if not isinstance(text, str):
        raise TypeError("not a string")
    instant = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def iso_utc(instant: datetime | None) -> str | None:
    """`2026-12-03T10:00:00Z`, as the heartbeat reports times."""
    if instant is None:
        return None
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def retry_delay(interval_s: float, failures: int) -> float:
    """After `failures` failed heartbeats in a row: the interval, doubled each time, capped at 60 s.

    The cap never shortens an interval the server asked for that is already above 60 s.
    """
    if failures <= 0:
        return interval_s
    return min(interval_s * 2**failures, max(MAX_BACKOFF_S, interval_s))

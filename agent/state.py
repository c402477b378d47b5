"""The node's state file: which server, which node, its token, and the leases it serves.

Written with mode 600 because it holds the node token, and atomically (write, then rename) so a
crash never leaves half a file.
"""

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agent.errors import AgentError

DEFAULT_STATE_PATH = "/var/lib/ibex-agent/node.json"


def default_state_path() -> Path:
    return Path(os.environ.get("IBEX_AGENT_STATE") or DEFAULT_STATE_PATH)


@dataclass
class NodeState:
    api: str
    node_id: int
    token: str
    hostname: str
    heartbeat_interval_s: float | None = None
    # lease id -> GPU indexes; kept here so a restarted agent still reports what it serves
    serving: dict[str, list[int]] = field(default_factory=dict)
    # lease id -> what the runtime runs for it (agent.workloads.Workload as a dict); kept here
    # so a restarted agent finds its supervisors again instead of starting a command twice
    workloads: dict[str, dict] = field(default_factory=dict)
    # lease id -> its GPU parts (agent.parts: {"devices": [...], "releasing"}); kept here so a
    # restarted agent still reports them and destroys its MIG slices when the lease ends
    parts: dict[str, dict] = field(default_factory=dict)


def save_state(path: Path, state: NodeState) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".tmp")
        temporary.unlink(missing_ok=True)
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(asdict(state), handle, indent=2)
            handle.write("\n")
        os.replace(temporary, path)
    except OSError as error:
        raise AgentError(f"cannot write {path}: {_reason(error)}") from None


def load_state(path: Path) -> NodeState:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise AgentError(f"no state file at {path}; run 'ibex-agent register' first") from None
    except OSError as error:
        raise AgentError(f"cannot read {path}: {_reason(error)}") from None
    except json.JSONDecodeError:
        raise AgentError(f"{path} is not valid JSON; run 'ibex-agent register' again") from None
    try:
        return NodeState(
            api=str(data["api"]),
            node_id=int(data["node_id"]),
            token=str(data["token"]),
            hostname=str(data["hostname"]),
            heartbeat_interval_s=data.get("heartbeat_interval_s"),
            serving={str(k): list(v) for k, v in (data.get("serving") or {}).items()},
            workloads={str(k): dict(v) for k, v in (data.get("workloads") or {}).items()},
            parts={str(k): dict(v) for k, v in (data.get("parts") or {}).items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise AgentError(f"{path} lacks api, node_id, token or hostname; run 'ibex-agent register' again") from None


def _reason(error: OSError) -> str:
    return (error.strerror or str(error)).lower()

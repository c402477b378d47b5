import json
import stat

import pytest

from agent.client import ApiError, describe_connection_error
from agent.errors import AgentError
from agent.state import NodeState, load_state, save_state


def test_state_round_trip_with_mode_600(tmp_path):
    path = tmp_path / "deep" / "node.json"
    state = NodeState(api="http://x", node_id=3, token="ibexnode_t", hostname="gpu01",
                      heartbeat_interval_s=15, serving={"L-1": [0]})

    save_state(path, state)
    save_state(path, state)  # overwriting keeps working

    assert load_state(path) == state
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not list(path.parent.glob("*.tmp"))


def test_a_broken_state_file_says_what_to_do(tmp_path):
    path = tmp_path / "node.json"
    path.write_text("{not json")
    with pytest.raises(AgentError, match="not valid JSON; run 'ibex-agent register' again"):
        load_state(path)
    path.write_text(json.dumps({"api": "http://x"}))
    with pytest.raises(AgentError, match="lacks api, node_id, token or hostname"):
        load_state(path)


def test_api_errors_read_as_one_line():
    assert str(ApiError(401, "not_authenticated", "x")) == "the server refused the key (401)"
    assert str(ApiError(401, "x", "y", credential="node token")) == "the server refused the node token (401)"
    error = ApiError(400, "invalid", "bad node", {"nodes.3.hostname": ["taken", "twice"]})
    assert str(error) == "the server said 400 invalid: bad node (nodes.3.hostname: taken twice)"
    many = ApiError(400, "invalid", "bad nodes", {f"nodes.{i}.fabric": ["unknown"] for i in range(500)})
    assert str(many).endswith("nodes.2.fabric: unknown; and 497 more)")


def test_connection_errors_name_the_cause():
    inner = ConnectionRefusedError(111, "Connection refused")
    outer = RuntimeError("wrapped")
    outer.__context__ = inner
    assert describe_connection_error(outer) == "connection refused"
    assert describe_connection_error(RuntimeError("plain")) == "plain"

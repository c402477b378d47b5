"""The workload contract's heartbeat fields, actions and launch environment (docs/workloads.md)."""

import threading
import time
from datetime import UTC, datetime

import pytest

from agent.client import ApiClient, ServerTrouble
from agent.heartbeat import Leases, heartbeat_body, parse_answer
from agent.ibports import IbPort
from agent.launch import launch_env, nccl_ib_hca, parse_launch
from agent.node import NodeAgent
from agent.state import NodeState, load_state, save_state
from agent.workloads import Runtime
from tests.agent.fake_ibex import FakeIbex

LAUNCH = {"generation": 2, "command": ["python3", "train.py"], "env": {"A": "b"}, "workdir": "runs/a",
          "ssh_keys": ["ssh-ed25519 AAAA alice"], "node_rank": 1, "nnodes": 2,
          "node_addrs": ["10.0.0.5", "10.0.0.6"], "master_addr": "10.0.0.5", "master_port": 29500}


def rails(count: int) -> list[IbPort]:
    return [IbPort(f"mlx5_{i}", 1, "active", 400) for i in range(count)]


def test_start_notice_and_stop_actions_carry_launch_until_and_grace():
    answer = parse_answer({"actions": [
        {"action": "start", "lease": 42, "gpus": [0, 1], "launch": LAUNCH},
        {"action": "notice", "lease": "42", "gpus": [0, 1], "until": "2026-12-03T10:00:00Z"},
        {"action": "stop", "lease": "42", "gpus": [0, 1], "grace_s": 30},
    ]})

    start, notice, stop = answer.actions
    assert start.lease == "42" and start.launch.generation == 2 and start.launch.command == ["python3", "train.py"]
    assert start.launch.node_addrs == ["10.0.0.5", "10.0.0.6"] and start.launch.master_port == 29500
    assert notice.until == datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    assert stop.grace_s == 30.0 and stop.launch is None


@pytest.mark.parametrize("action", [
    {"action": "start", "lease": "1", "launch": {"command": ["x"]}},  # no generation
    {"action": "start", "lease": "1", "launch": {**LAUNCH, "command": "python3 train.py"}},
    {"action": "start", "lease": "1", "launch": {**LAUNCH, "workdir": "../other"}},
    {"action": "start", "lease": "1", "launch": {**LAUNCH, "env": {"A B": "c"}}},
    {"action": "start", "lease": "1", "launch": ["not", "an", "object"]},
    {"action": "notice", "lease": "1", "until": "tomorrow"},
    {"action": "stop", "lease": "1", "grace_s": "soon"},
])
def test_a_malformed_action_is_server_trouble(action):
    with pytest.raises(ServerTrouble, match="malformed"):
        parse_answer({"actions": [action]})


def test_a_launch_with_only_ssh_keys_has_no_command():
    launch = parse_launch({**LAUNCH, "command": None})
    assert launch.command is None and launch.ssh_keys == ["ssh-ed25519 AAAA alice"]


def test_the_body_keeps_leases_being_torn_down_in_serving():
    body = heartbeat_body([], [], Leases({"7": [0]}), runtime={"kind": "process", "address": "a", "ssh_port": None},
                          workloads=[], wait_s=15, also_serving={"3"})
    assert body["serving"] == ["3", "7"]
    assert body["wait_s"] == 15 and body["workloads"] == [] and body["runtime"]["kind"] == "process"


def test_the_launch_env_is_the_contracts_table_and_the_tenant_cannot_override_it():
    launch = parse_launch({**LAUNCH, "env": {"NODE_RANK": "0", "CUDA_VISIBLE_DEVICES": "7",
                                             "NCCL_IB_HCA": "mlx5_9", "WANDB_MODE": "offline"}})
    env = launch_env("42", launch, [5, 4], rails(8), 8, "ibex-l42", "/w/leases/ibex-l42", "10.0.0.6", 29500)

    assert env == {
        "IBEX_LEASE_ID": "42", "NODE_RANK": "1", "NNODES": "2", "GPUS_PER_NODE": "2",
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29500", "IBEX_NODE_ADDRS": "10.0.0.5,10.0.0.6",
        "CUDA_VISIBLE_DEVICES": "4,5", "NCCL_IB_HCA": "=mlx5_4:1,mlx5_5:1",
        "HOME": "/w/leases/ibex-l42", "USER": "ibex-l42", "LOGNAME": "ibex-l42",
        "PATH": "/usr/local/bin:/usr/bin:/bin", "WANDB_MODE": "offline",
    }


def test_nccl_ib_hca_names_the_rails_of_the_leased_gpus():
    assert nccl_ib_hca([0, 1, 5], rails(4), 8) == "=mlx5_0:1,mlx5_2:1"  # two GPUs per rail
    assert nccl_ib_hca([3], [IbPort("mlx5_0", 1, "active", 400), IbPort("mlx5_0", 2, "active", 400)], 4) == "=mlx5_0:2"
    assert nccl_ib_hca([0], [], 8) is None
    no_ib = launch_env("1", parse_launch({**LAUNCH, "env": {"NCCL_IB_HCA": "mlx5_0"}}), [0], [], 8,
                       "ibex-l1", "/h", "a", 1)
    assert "NCCL_IB_HCA" not in no_ib  # no IB here: the tenant's guess is not passed on


def test_runtime_none_reports_its_kind_and_ignores_launches(tmp_path):
    runtime = Runtime("none", "gpu01", tmp_path / "work", node_id=1)
    runtime.prepare()  # nothing to make, root or not

    answer = parse_answer({"actions": [{"action": "start", "lease": "9", "gpus": [0], "launch": LAUNCH}]})
    runtime.apply(answer.actions)

    assert runtime.descriptor() == {"kind": "none", "address": "gpu01", "ssh_port": None}
    assert runtime.reports() == [] and not (tmp_path / "work").exists()


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        yield server


def test_a_held_answer_is_the_interval_and_news_is_reported_at_once(ibex, tmp_path):
    ibex.hold_heartbeats = True
    ibex.heartbeat_interval_s = 1
    node = ibex.add_node("gpu01")
    path = tmp_path / "node.json"
    save_state(path, NodeState(api=ibex.url, node_id=node.id, token=node.token, hostname="gpu01"))
    agent = NodeAgent(ApiClient(ibex.url, timeout_s=0.5), load_state(path), path, lambda: [], lambda: [],
                      interval_s=1, runtime=Runtime("none", "gpu01", tmp_path / "work", node.id))
    sent: list[float] = []
    original = agent.client.heartbeat
    agent.client.heartbeat = lambda *args: (sent.append(time.monotonic()), original(*args))[1]
    thread = threading.Thread(target=agent.run_forever)
    thread.start()
    try:
        wait_until(lambda: len(sent) >= 3)
        ibex.queue_action(node.id, "start", "5", [0])  # ends the hold at once
        wait_until(lambda: any(beat["serving"] == ["5"] for beat in node.heartbeats))
        reported = len(sent) - 1
        wait_until(lambda: len(sent) >= reported + 2)
    finally:
        agent.stop.set()
        thread.join(5)

    gaps = [later - earlier for earlier, later in zip(sent, sent[1:], strict=False)]
    held = gaps[: reported - 2] + [gaps[reported]]
    assert all(0.9 < gap < 1.5 for gap in held), gaps  # held 1 s (past the 0.5 s timeout), then at once
    assert gaps[reported - 1] < 0.3, gaps  # the start's answer came at once, and so did the report
    assert all(beat["wait_s"] == 1 for beat in node.heartbeats)


def wait_until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_workload_sees_its_leases_pkey_and_the_tenant_cannot_name_another():
    launch = parse_launch({**LAUNCH, "ib_pkey": "0x1a2b", "env": {"IBEX_IB_PKEY": "0x7fff"}})
    single = parse_launch({**LAUNCH, "env": {"IBEX_IB_PKEY": "0x7fff"}})

    env = launch_env("42", launch, [5], rails(8), 8, "ibex-l42", "/h", "10.0.0.6", 29500)
    alone = launch_env("42", single, [5], rails(8), 8, "ibex-l42", "/h", "10.0.0.6", 29500)

    assert env["IBEX_IB_PKEY"] == "0x1a2b"
    assert "IBEX_IB_PKEY" not in alone


def test_a_launch_with_a_malformed_pkey_is_refused():
    with pytest.raises(ValueError):
        parse_launch({**LAUNCH, "ib_pkey": "0x1a2b; rm -rf /"})


def rails_with_pkeys(tables: list[tuple[int, ...]]) -> list[IbPort]:
    return [IbPort(f"mlx5_{i}", 1, "active", 400, pkeys=table) for i, table in enumerate(tables)]


def test_nccl_is_given_the_index_of_the_leases_pkey_in_its_rails_tables():
    launch = parse_launch({**LAUNCH, "ib_pkey": "0x1a2b", "env": {"NCCL_IB_PKEY": "0"}})
    # GPUs 2 and 3 of 4 sit on rails 2 and 3, where OpenSM put 0x9a2b (full member) at index 1
    tables = [(0xFFFF,), (0xFFFF,), (0xFFFF, 0x9A2B), (0xFFFF, 0x9A2B)]

    env = launch_env("42", launch, [2, 3], rails_with_pkeys(tables), 4, "ibex-l42", "/h",
                     "10.0.0.6", 29500)

    assert env["NCCL_IB_PKEY"] == "1"
    assert env["NCCL_IB_HCA"] == "=mlx5_2:1,mlx5_3:1"


def test_no_nccl_pkey_before_opensm_put_the_partition_on_every_rail_of_the_lease():
    launch = parse_launch({**LAUNCH, "ib_pkey": "0x1a2b", "env": {"NCCL_IB_PKEY": "3"}})
    tables = [(0xFFFF, 0x9A2B), (0xFFFF,)]  # rail 1 not yet programmed

    env = launch_env("42", launch, [0, 1], rails_with_pkeys(tables), 2, "ibex-l42", "/h",
                     "10.0.0.6", 29500)

    assert "NCCL_IB_PKEY" not in env  # nor the tenant's own guess

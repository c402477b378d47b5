"""Parts of GPUs: MIG slices made and destroyed through NVML (a stand-in here: no GPU), shares
enforced through the MPS control daemon's variables, and both reported in `devices`."""

import os
import threading
import time

import pytest

from agent import mig_check
from agent.client import ApiClient, ServerTrouble
from agent.fleet import Fleet, FleetOptions
from agent.heartbeat import Action, parse_answer
from agent.ibports import IbPort
from agent.launch import launch_env, parse_launch, parts_env, unusable_parts
from agent.mig import MigControl
from agent.node import NodeAgent
from agent.parts import (
    NodeEnforcer,
    Part,
    PartsManager,
    SimulatedEnforcer,
    parse_parts,
    simulated_mig_uuid,
)
from agent.state import NodeState, load_state, save_state
from tests.agent import fake_nvml
from tests.agent.fake_ibex import PROVIDER_KEY, FakeIbex
from tests.agent.fake_nvml import FakeNvml

SLICE = {"index": 0, "mig_profile": "1g.10gb", "start": 0}
SHARE = {"index": 1, "share": 250, "memory_mib": 20480}


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def mps_daemon(directory) -> str:
    """A pipe directory as the MPS control daemon leaves it: a FIFO named `control`."""
    os.mkfifo(directory / "control")
    return str(directory)


def enforcer(nvml: FakeNvml, pipe_directory: str = "/nonexistent/nvidia-mps", trace=None) -> NodeEnforcer:
    return NodeEnforcer(MigControl(nvml, list(range(nvml.gpus)), trace), pipe_directory=pipe_directory)


def start(lease: str, parts: list[dict] | None, gpus=(0,)) -> Action:
    return Action("start", lease, list(gpus), parts=parse_parts(parts) if parts is not None else None)


def stop(lease: str) -> Action:
    return Action("stop", lease, [])


# MIG through NVML

def test_a_slice_is_a_gpu_instance_at_its_placement_and_a_compute_instance_reported_by_uuid():
    nvml = FakeNvml()
    device = enforcer(nvml).set_up(Part(0, mig_profile="1g.10gb", start=3))

    assert device.report() == {"index": 0, "mig_profile": "1g.10gb", "start": 3,
                               "uuid": "MIG-fake-0-1-0", "enforced": True, "error": ""}
    made = [call for call in nvml.calls if call[0] != "nvmlDeviceGetGpuInstanceProfileInfo"]
    assert made[:2] == [("nvmlDeviceGetMigMode", 0), ("nvmlDeviceCreateGpuInstanceWithPlacement", 0, 19, 3, 1)]
    assert [call[0] for call in made[2:6]] == [
        "nvmlGpuInstanceGetInfo", "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        "nvmlGpuInstanceCreateComputeInstance", "nvmlComputeInstanceGetInfo"]
    assert made[3] == ("nvmlGpuInstanceGetComputeInstanceProfileInfo", 1, nvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                       nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    assert nvml.slices(0) == [(3, 1, 1)]


@pytest.mark.parametrize("v2_names", [True, False])
@pytest.mark.parametrize(("profile", "start", "profile_id", "size"), [
    ("1g.20gb", 2, 15, 2),  # the double-memory 1g: two memory slots
    ("2g.20gb", 4, 14, 2),
    ("3g.40gb", 4, 9, 4),
    ("4g.40gb", 0, 5, 4),
    ("7g.80gb", 0, 0, 8),
])
def test_profile_names_map_onto_nvml_profiles_by_compute_and_memory(profile, start, profile_id, size, v2_names):
    nvml = FakeNvml(v2_names=v2_names)  # without names (older NVML): the nearest memory size
    device = enforcer(nvml).set_up(Part(0, mig_profile=profile, start=start))

    assert device.enforced, device.error
    assert ("nvmlDeviceCreateGpuInstanceWithPlacement", 0, profile_id, start, size) in nvml.calls


def test_the_slice_is_destroyed_compute_instance_first_when_the_lease_stops():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    parts.apply([start("L-1", [SLICE, {**SLICE, "start": 1}])])
    nvml.calls.clear()

    parts.apply([stop("L-1")])
    assert parts.tearing_down() == {"L-1"}
    assert parts.release() is True

    assert nvml.names() == ["nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetComputeInstanceById",
                            "nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"] * 2
    assert nvml.slices(0) == [] and parts.reports() == {} and parts.tearing_down() == set()


def test_nvmls_refusal_is_the_devices_error_and_nothing_is_left_half_made():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    parts.apply([start("L-1", [{"index": 0, "mig_profile": "3g.40gb", "start": 0}])])
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = fake_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES

    parts.apply([start("L-2", [{"index": 0, "mig_profile": "1g.10gb", "start": 0},  # taken by L-1
                               {"index": 0, "mig_profile": "1g.10gb", "start": 5}])])  # its CI fails

    assert parts.reports()["L-2"] == [
        {"index": 0, "mig_profile": "1g.10gb", "start": 0, "uuid": "", "enforced": False,
         "error": "nvmlDeviceCreateGpuInstanceWithPlacement: Insufficient Resources"},
        {"index": 0, "mig_profile": "1g.10gb", "start": 5, "uuid": "", "enforced": False,
         "error": "nvmlGpuInstanceCreateComputeInstance: Insufficient Resources"},
    ]
    assert nvml.slices(0) == [(0, 4, 1)]  # L-1's only: the half-made GPU instance was destroyed
    parts.apply([stop("L-2")])
    assert parts.release() is True  # nothing of L-2 to destroy


@pytest.mark.parametrize(("part", "error"), [
    ({"index": 0, "mig_profile": "1g.10gb", "start": 7}, "1g.10gb cannot start at memory slot 7"),
    ({"index": 0, "mig_profile": "3g.40gb", "start": 2}, "3g.40gb cannot start at memory slot 2"),
    ({"index": 0, "mig_profile": "big", "start": 0}, "'big' is not a MIG profile name like 1g.10gb"),
    ({"index": 0, "mig_profile": "5g.50gb", "start": 0}, "no MIG profile has 5 compute slices (5g.50gb)"),
    ({"index": 9, "mig_profile": "1g.10gb", "start": 0}, "GPU 9 is not on this node (2 GPUs)"),
])
def test_a_part_nvml_cannot_place_is_refused_before_asking_it(part, error):
    nvml = FakeNvml()
    device = enforcer(nvml).set_up(parse_parts([part])[0])

    assert (device.enforced, device.error) == (False, error)
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in nvml.names()


def test_a_gpu_without_mig_mode_gets_no_slice_and_says_so():
    nvml = FakeNvml(mig_enabled=False)
    device = enforcer(nvml).set_up(Part(0, mig_profile="1g.10gb", start=0))

    assert (device.enforced, device.error) == (False, "MIG mode is not enabled on GPU 0")
    assert nvml.names() == ["nvmlDeviceGetMigMode"]  # the agent never turns MIG mode on itself


def test_without_nvml_a_slice_is_not_enforced_with_nvmls_reason():
    device = NodeEnforcer(None, "NVML is not available (Driver Not Loaded)").set_up(Part(0, "1g.10gb", 0))
    assert device.error == "NVML is not available (Driver Not Loaded): MIG slice not created"


def test_a_slice_in_use_is_destroyed_on_a_later_try_and_its_lease_stays_served_until_then():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    parts.apply([start("L-1", [SLICE])])
    parts.apply([stop("L-1")])
    nvml.fail["nvmlGpuInstanceDestroy"] = fake_nvml.NVML_ERROR_IN_USE

    assert parts.release() is False
    assert parts.tearing_down() == {"L-1"} and "L-1" in parts.reports()

    del nvml.fail["nvmlGpuInstanceDestroy"]
    assert parts.release() is True
    assert nvml.slices(0) == [] and parts.tearing_down() == set()


def test_a_slice_someone_else_destroyed_counts_as_destroyed():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    parts.apply([start("L-1", [SLICE])])
    nvml.instances.clear()  # e.g. `nvidia-smi mig -dgi` by an operator

    parts.apply([stop("L-1")])
    assert parts.release() is True


def test_slices_are_not_destroyed_while_the_leases_processes_run():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    parts.apply([start("L-1", [SLICE]), stop("L-1")])

    assert parts.release(busy=lambda lease: True) is False
    assert nvml.slices(0) == [(0, 1, 1)]
    assert parts.release(busy=lambda lease: False) is True


def test_a_repeated_start_retries_a_slice_that_could_not_be_made_and_leaves_made_ones_alone():
    nvml = FakeNvml()
    parts = PartsManager(enforcer(nvml))
    nvml.fail["nvmlDeviceCreateGpuInstanceWithPlacement"] = fake_nvml.NVML_ERROR_NO_PERMISSION
    assert parts.apply([start("L-1", [SLICE])]) is True
    assert parts.reports()["L-1"][0]["error"] == "nvmlDeviceCreateGpuInstanceWithPlacement: Insufficient Permissions"

    del nvml.fail["nvmlDeviceCreateGpuInstanceWithPlacement"]
    assert parts.apply([start("L-1", [SLICE])]) is True
    assert parts.reports()["L-1"][0]["enforced"] is True
    assert parts.apply([start("L-1", [SLICE])]) is False  # nothing more to do
    assert nvml.slices(0) == [(0, 1, 1)]


def test_a_slice_replaced_mid_lease_is_destroyed_even_after_the_agent_restarts():
    nvml = FakeNvml()
    saved = {}
    parts = PartsManager(enforcer(nvml), save=lambda: saved.update(parts.snapshot()))
    parts.apply([start("L-1", [SLICE])])
    moved = {**SLICE, "start": 1}
    parts.apply([start("L-1", [moved])])  # the server moved the slice; the old one is in use
    assert parts.release(busy=lambda lease: True) is False
    assert len(nvml.slices(0)) == 2

    restarted = PartsManager(enforcer(nvml), records=saved)
    restarted.release(busy=lambda lease: False)
    assert [start for start, *_ in nvml.slices(0)] == [1]
    assert restarted.reports()["L-1"][0]["start"] == 1


# shares through MPS

def test_a_share_is_enforced_where_the_mps_control_daemon_listens(tmp_path):
    device = enforcer(FakeNvml(), mps_daemon(tmp_path)).set_up(parse_parts([SHARE])[0])
    assert device.report() == {**SHARE, "enforced": True, "error": ""}


def test_without_an_mps_control_daemon_a_share_is_reported_not_enforced(tmp_path):
    parts = PartsManager(enforcer(FakeNvml(), str(tmp_path)))
    parts.apply([start("L-1", [SHARE], gpus=[1])])

    assert parts.reports() == {"L-1": [{
        **SHARE, "enforced": False,
        "error": f"no MPS control daemon on this node (no control pipe {tmp_path}/control): share not enforced"}]}

    mps_daemon(tmp_path)  # started later: the next heartbeat says so
    assert parts.reports()["L-1"][0]["enforced"] is True


@pytest.mark.parametrize(("share", "memory_mib", "error"), [
    (0, 1024, "share must be 1-999 thousandths, not 0"),
    (1000, 1024, "share must be 1-999 thousandths, not 1000"),
    (250, 0, "memory_mib must be positive, not 0"),
])
def test_a_share_out_of_range_is_not_enforced(tmp_path, share, memory_mib, error):
    device = enforcer(FakeNvml(), mps_daemon(tmp_path)).set_up(Part(0, share=share, memory_mib=memory_mib))
    assert (device.enforced, device.error) == (False, error)


# the contract: actions and heartbeats

def test_a_start_action_carries_parts_and_one_without_is_whole_gpus():
    answer = parse_answer({"actions": [
        {"action": "start", "lease": "L-1", "gpus": [0, 1], "parts": [SLICE, SHARE]},
        {"action": "start", "lease": "L-2", "gpus": [2]},
    ]})
    assert answer.actions[0].parts == [Part(0, mig_profile="1g.10gb", start=0),
                                       Part(1, share=250, memory_mib=20480)]
    assert answer.actions[1].parts is None


@pytest.mark.parametrize("parts", [
    "1g.10gb", [{"mig_profile": "1g.10gb", "start": 0}], [{"index": 0, "mig_profile": "1g.10gb"}],
    [{"index": 0, "share": 250}], [{"index": "0", "share": 250, "memory_mib": 1}],
    [{"index": 0, "mig_profile": 7, "start": 0}], [["index", 0]],
])
def test_malformed_parts_are_server_trouble(parts):
    with pytest.raises(ServerTrouble, match="malformed"):
        parse_answer({"actions": [{"action": "start", "lease": "L-1", "gpus": [0], "parts": parts}]})


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        yield server


def node_agent(ibex, tmp_path, nvml: FakeNvml, pipe_directory: str = "/nonexistent") -> tuple:
    node = ibex.add_node("gpu01")
    path = tmp_path / "node.json"
    save_state(path, NodeState(api=ibex.url, node_id=node.id, token=node.token, hostname="gpu01"))
    return node, path, lambda: NodeAgent(ApiClient(ibex.url), load_state(path), path, lambda: [], lambda: [],
                                         enforcer=enforcer(nvml, pipe_directory))


def test_heartbeats_report_each_leases_devices_in_the_order_of_its_parts(ibex, tmp_path):
    nvml = FakeNvml()
    node, path, new_agent = node_agent(ibex, tmp_path, nvml)
    agent = new_agent()
    ibex.queue_action(node.id, "start", "L-1", [0, 1], parts=[SHARE, SLICE])
    ibex.queue_action(node.id, "start", "L-2", [1])

    agent.beat()
    assert agent.news  # the devices are news the server waits for
    agent.beat()

    beat = node.heartbeats[-1]
    assert beat["serving"] == ["L-1", "L-2"]
    assert beat["devices"] == {"L-1": [
        {**SHARE, "enforced": False,
         "error": "no MPS control daemon on this node (no control pipe /nonexistent/control): share not enforced"},
        {**SLICE, "uuid": "MIG-fake-0-1-0", "enforced": True, "error": ""},
    ]}  # L-2 is a whole-GPU lease: no devices
    assert "devices" not in node.heartbeats[0]  # none before: the key is left out


def test_a_restarted_agent_still_reports_its_slices_and_destroys_them_at_the_stop(ibex, tmp_path):
    nvml = FakeNvml()
    node, path, new_agent = node_agent(ibex, tmp_path, nvml)
    ibex.queue_action(node.id, "start", "L-1", [0], parts=[SLICE])
    new_agent().beat()
    assert load_state(path).parts["L-1"]["devices"][0]["gpu_instance_id"] == 1

    restarted = new_agent()
    ibex.queue_action(node.id, "stop", "L-1", [0])
    restarted.beat()
    assert node.heartbeats[-1]["devices"]["L-1"][0]["uuid"] == "MIG-fake-0-1-0"
    restarted.beat()

    assert nvml.slices(0) == [] and node.heartbeats[-1]["serving"] == [] and "devices" not in node.heartbeats[-1]
    assert load_state(path).parts == {}


def test_a_stopped_lease_stays_in_serving_until_its_slice_is_destroyed(ibex, tmp_path):
    nvml = FakeNvml()
    node, path, new_agent = node_agent(ibex, tmp_path, nvml)
    agent = new_agent()
    ibex.queue_action(node.id, "start", "L-1", [0], parts=[SLICE])
    agent.beat()
    nvml.fail["nvmlGpuInstanceDestroy"] = fake_nvml.NVML_ERROR_IN_USE
    ibex.queue_action(node.id, "stop", "L-1", [0])
    agent.beat()
    agent.beat()
    assert node.heartbeats[-1]["serving"] == ["L-1"]

    del nvml.fail["nvmlGpuInstanceDestroy"]
    agent.beat()
    assert node.heartbeats[-1]["serving"] == [] and nvml.slices(0) == []


# what the lease's processes see

def rails(count: int) -> list[IbPort]:
    return [IbPort(f"mlx5_{i}", 1, "active", 400) for i in range(count)]


LAUNCH = parse_launch({"generation": 1, "command": ["python3", "train.py"],
                       "env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_VISIBLE_DEVICES": "0"}})


def test_a_slice_is_the_only_visible_device_by_its_mig_uuid():
    devices = [{**SLICE, "uuid": "MIG-abc", "enforced": True, "error": ""}]
    env = launch_env("7", LAUNCH, [0], rails(8), 8, "ibex-l7", "/h", "10.0.0.5", 29500, devices)

    assert env["CUDA_VISIBLE_DEVICES"] == "MIG-abc" and env["GPUS_PER_NODE"] == "1"
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"  # the tenant's own: no share here


def test_a_share_sets_mps_thread_percentage_and_pinned_memory_limit_over_the_tenants():
    devices = [{"index": 3, "share": 250, "memory_mib": 20480, "enforced": True, "error": ""}]
    env = launch_env("7", LAUNCH, [3], rails(8), 8, "ibex-l7", "/h", "10.0.0.5", 29500, devices, "/run/mps")

    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["GPUS_PER_NODE"] == "1"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # the process's device 0 is GPU 3
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"


def test_several_parts_list_in_order_and_shares_limit_each_device_by_its_ordinal():
    devices = [{"index": 2, "share": 125, "memory_mib": 10240}, {"index": 5, "share": 500, "memory_mib": 40960}]
    visible, variables = parts_env([2, 5, 6], devices)

    assert visible == ["2", "5", "6"]  # GPU 6 has no part: the lease has it whole
    assert variables == {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "12",  # the smallest share
                         "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M,1=40960M"}
    assert parts_env([0], [{"index": 0, "share": 5, "memory_mib": 512}])[1][
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "1"  # never 0: that is no limit to MPS


def test_a_command_cannot_start_on_a_slice_that_was_not_made():
    failed = [{**SLICE, "uuid": "", "enforced": False, "error": "MIG mode is not enabled on GPU 0"}]
    assert unusable_parts(failed) == "MIG slice 1g.10gb at slot 0 of GPU 0 is not set up: MIG mode is not enabled on GPU 0"
    unenforced_share = [{**SHARE, "enforced": False, "error": "no MPS control daemon"}]
    assert unusable_parts(unenforced_share) == "" and unusable_parts(None) == ""


# simulated

def test_simulated_parts_are_enforced_with_the_same_mig_uuids_every_run():
    def reported(hostname: str) -> dict:
        parts = PartsManager(SimulatedEnforcer(hostname))
        parts.apply([start("L-1", [SLICE, {**SLICE, "index": 1}, SHARE])])
        return parts.reports()["L-1"]

    first = reported("gpu01")
    assert first == reported("gpu01")
    slice0, slice1, share = first
    assert slice0["uuid"].startswith("MIG-") and len(slice0["uuid"]) == 40 and slice0["uuid"] != slice1["uuid"]
    assert slice0["uuid"] != reported("gpu02")[0]["uuid"]
    assert all(device["enforced"] and device["error"] == "" for device in first)
    assert share == {**SHARE, "enforced": True, "error": ""}


def test_a_simulated_part_nvml_would_refuse_is_not_enforced():
    parts = PartsManager(SimulatedEnforcer("gpu01"))
    parts.apply([start("L-1", [{"index": 0, "mig_profile": "1g.10gb", "start": 7}])])
    assert parts.reports()["L-1"] == [{"index": 0, "mig_profile": "1g.10gb", "start": 7, "uuid": "",
                                       "enforced": False, "error": "1g.10gb cannot start at memory slot 7"}]


def test_simulate_reports_devices_for_leases_with_parts(ibex):
    ibex.heartbeat_interval_s = 0.05
    fleet = Fleet(FleetOptions(api=ibex.url, key=PROVIDER_KEY, fabric="fab1", hostnames=["gpu01"],
                               gpu_model="H100-80GB", gpus=8, interval_s=0.05, workers=1))
    thread = threading.Thread(target=fleet.run)
    thread.start()
    try:
        wait_for(lambda: ibex.nodes and ibex.node_named("gpu01").heartbeats)
        node = ibex.node_named("gpu01")
        ibex.queue_action(node.id, "start", "L-1", [0, 1], parts=[SLICE, SHARE], launch={
            "generation": 1, "command": ["python3", "x.py"], "env": {"IBEX_SIMULATED_SECONDS": "60"}})
        wait_for(lambda: "devices" in node.heartbeats[-1])
        ibex.queue_action(node.id, "stop", "L-1", [0, 1])
        wait_for(lambda: node.heartbeats[-1]["serving"] == [])
    finally:
        fleet.stop.set()
        thread.join(5)

    devices = next(beat["devices"] for beat in node.heartbeats if "devices" in beat)["L-1"]
    assert devices == [{**SLICE, "uuid": simulated_mig_uuid("gpu01", Part(**SLICE)), "enforced": True, "error": ""},
                       {**SHARE, "enforced": True, "error": ""}]
    assert "devices" not in node.heartbeats[-1]
    assert f"CUDA_VISIBLE_DEVICES={devices[0]['uuid']},1" in node.log_lines("L-1")[0]


# the device check script (python -m agent.mig_check)

def test_the_mig_check_makes_and_destroys_a_slice_through_the_agent_saying_what_nvml_said(capsys):
    nvml = FakeNvml()
    assert mig_check.main(["--gpu", "1", "--start", "2"], nvml=nvml) == 0

    out = capsys.readouterr().out
    assert "MIG mode: current enabled, pending enabled" in out
    assert "profile 1g.20gb: NVML id 15 (NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2)" in out
    assert "  NVML nvmlDeviceCreateGpuInstanceWithPlacement: ok" in out
    assert '"mig_profile": "1g.10gb", "start": 2, "uuid": "MIG-fake-1-1-0", "enforced": true' in out
    assert "  NVML nvmlGpuInstanceDestroy: ok" in out
    assert "GPU instance 1 is gone (nvmlDeviceGetGpuInstanceById: Not Found)" in out
    assert nvml.slices(1) == [] and nvml.names()[-1] == "nvmlShutdown"


def test_the_mig_check_leaves_mig_mode_off_unless_asked_and_reports_the_agents_answer(capsys):
    nvml = FakeNvml(mig_enabled=False)
    assert mig_check.main([], nvml=nvml) == 1

    out = capsys.readouterr().out
    assert "MIG mode is off; leaving it so" in out
    assert '"enforced": false, "error": "MIG mode is not enabled on GPU 0"' in out
    assert "nvmlDeviceSetMigMode" not in nvml.names()


def test_the_mig_check_turns_mig_mode_on_and_off_again_when_asked(capsys):
    nvml = FakeNvml(mig_enabled=False)
    assert mig_check.main(["--enable-mig"], nvml=nvml) == 0

    out = capsys.readouterr().out
    assert "nvmlDeviceSetMigMode(enable): ok" in out and "nvmlDeviceSetMigMode(disable): ok" in out
    assert nvml.mig_mode[0] == nvml.NVML_DEVICE_MIG_DISABLE


def test_the_mig_check_prints_nvmls_refusal(capsys):
    nvml = FakeNvml()
    nvml.fail["nvmlDeviceCreateGpuInstanceWithPlacement"] = fake_nvml.NVML_ERROR_NO_PERMISSION
    assert mig_check.main([], nvml=nvml) == 1
    out = capsys.readouterr().out
    assert "  NVML nvmlDeviceCreateGpuInstanceWithPlacement: Insufficient Permissions" in out
    assert '"error": "nvmlDeviceCreateGpuInstanceWithPlacement: Insufficient Permissions"' in out

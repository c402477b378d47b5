import json

import pytest

from agent.errors import AgentError
from agent.simulated import Control, ControlFile, SimulatedHost, gpu_memory_mib, parse_control


def test_idle_and_busy_gpus_read_plausibly():
    host = SimulatedHost("gpu01", "H100-80GB", 8, seed=1)
    host.leases.serving = {"L-1": [0, 1]}

    for _ in range(20):
        samples = host.sample(Control())
        for busy in samples[:2]:
            assert 60 <= busy.temperature_c <= 75 and 90 <= busy.utilization_pct <= 100
            assert 0.6 * 81559 <= busy.memory_used_mib <= 0.95 * 81559
        for idle in samples[2:]:
            assert 30 <= idle.temperature_c <= 40 and idle.utilization_pct == 0
            assert idle.memory_used_mib <= 5
        assert all(s.ecc_errors == 0 and s.xid_errors == 0 for s in samples)


def test_failed_and_degraded_gpus():
    host = SimulatedHost("gpu03", "H100-80GB", 4)
    control = Control(fail_gpus={"gpu03": frozenset({2})}, degrade_gpus={"gpu03": frozenset({1})})

    beats = [host.sample(control) for _ in range(3)]

    assert all(b[2].ecc_errors >= 1 and b[2].xid_errors == 79 and b[2].utilization_pct == 0 for b in beats)
    assert [b[1].xid_errors for b in beats] == [1, 2, 3]
    assert all(b[1].temperature_c >= 90 for b in beats)
    assert host.sample(Control())[1].xid_errors == 0  # repaired once out of the control file


def test_registration_describes_every_gpu():
    spec = SimulatedHost("gpu01", "A100-40GB", 2).registration("fab1", 64, 512)
    assert spec["gpu_count"] == 2 and spec["cpu_cores"] == 64 and spec["memory_gib"] == 512
    assert [g["memory_mib"] for g in spec["gpus"]] == [40960, 40960]
    assert spec["gpus"][0]["uuid"] != spec["gpus"][1]["uuid"]
    assert spec["gpus"][0]["uuid"] == SimulatedHost("gpu01", "A100-40GB", 2).gpu_uuid(0)


def test_memory_from_the_model_name():
    assert gpu_memory_mib("H100-80GB") == 81559
    assert gpu_memory_mib("RTX6000-48GB") == 48 * 1024


def test_control_file_reloads_and_survives_mistakes(tmp_path):
    path = tmp_path / "control.json"
    control = ControlFile(path)
    assert control.refresh() is False  # no file: no failures
    path.write_text(json.dumps({"stop_heartbeats": ["gpu05"], "fail_gpus": {"gpu03": [2]}}))

    assert control.refresh(force=True) is True
    assert control.current.stop_heartbeats == {"gpu05"}
    assert control.current.fail_gpus == {"gpu03": {2}}

    path.write_text("{oops")
    with pytest.raises(AgentError, match="cannot read control file"):
        control.refresh(force=True)
    assert control.current.stop_heartbeats == {"gpu05"}  # the last good one stays


def test_control_shape_errors_are_explained():
    with pytest.raises(AgentError, match="expected"):
        parse_control({"fail_gpus": ["gpu03"]}, "control.json")
    with pytest.raises(AgentError, match="expected a JSON object"):
        parse_control([], "control.json")

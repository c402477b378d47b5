"""NVML: absent here (no driver), so the reader must say so clearly; the logic runs on a stand-in."""

import sys
import types

import pytest

from agent import nvml
from agent.nvml import NvmlReader, NvmlUnavailable, model_name, open_nvml


def test_without_a_driver_nvml_is_unavailable_with_a_clear_message():
    pytest.importorskip("pynvml")
    with pytest.raises(NvmlUnavailable, match=r"NVML is not available \(.*\); is the NVIDIA driver installed\?"):
        open_nvml()


def test_without_the_package_nvml_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(NvmlUnavailable, match="nvidia-ml-py package is not installed"):
        open_nvml()


def test_the_simulated_path_does_not_touch_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    from agent.simulated import Control, SimulatedHost

    assert len(SimulatedHost("gpu01", "H100-80GB", 8).sample(Control())) == 8


@pytest.mark.parametrize(("name", "memory_mib", "model"), [
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
    ("NVIDIA H200", 143771, "H200-141GB"),
    ("NVIDIA L40S", 46068, "L40S-48GB"),
    ("NVIDIA A100-PCIE-40GB", 40960, "A100-40GB"),
    ("NVIDIA H100 NVL", 95830, "H100-94GB"),
])
def test_model_names(name, memory_mib, model):
    assert model_name(name, memory_mib) == model


class NVMLError(Exception):
    pass


def fake_pynvml(lost: set[int]) -> types.SimpleNamespace:
    """A stand-in for pynvml with two GPUs, enough to exercise the reader's logic."""
    def check(handle):
        if handle in lost:
            raise NVMLError("GPU is lost")

    events = []
    def wait(event_set, timeout_ms):
        if not events:
            raise NVMLError("Timeout")
        return events.pop(0)

    fake = types.SimpleNamespace(
        NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0, nvmlEventTypeXidCriticalError=8,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetIndex=lambda handle: handle,
        nvmlEventSetCreate=lambda: "events",
        nvmlDeviceRegisterEvents=lambda handle, types_, event_set: None,
        nvmlEventSetWait=wait,
        nvmlDeviceGetTemperature=lambda h, sensor: check(h) or 41,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=2 * 2**30, total=80 * 2**30),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 3 if h == 1 else 0,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlSystemGetDriverVersion=lambda: "550.54.15",
    )
    fake.events = events
    return fake


def test_reader_samples_counts_xid_events_and_reports_lost_gpus():
    fake = fake_pynvml(lost=set())
    reader = NvmlReader(fake)
    fake.events.append(types.SimpleNamespace(device=1, eventData=13))

    first = reader.sample()
    assert [(s.temperature_c, s.utilization_pct, s.memory_used_mib) for s in first] == [(41, 97, 2048)] * 2
    assert [(s.ecc_errors, s.xid_errors) for s in first] == [(0, 0), (3, 1)]

    lost = fake_pynvml(lost={0})
    reader.nvml = lost
    reader.events = "events"
    second = reader.sample()
    assert (second[0].temperature_c, second[0].xid_errors) == (0, 1)


def test_inventory_for_registration():
    inventory = NvmlReader(fake_pynvml(lost=set())).inventory()
    assert inventory.gpu_model == "H100-80GB"
    assert inventory.driver_version == "550.54.15"
    assert inventory.gpus == [{"index": 0, "uuid": "GPU-0", "memory_mib": 81920},
                              {"index": 1, "uuid": "GPU-1", "memory_mib": 81920}]


def test_module_imports_no_nvml_at_import_time():
    assert "pynvml" not in vars(nvml)


class NotSupported(NVMLError):
    pass


def test_a_gpu_in_mig_mode_reads_0_percent_busy_not_failed():
    fake = fake_pynvml(lost=set())
    fake.NVMLError_NotSupported = NotSupported

    def no_utilization(handle):
        raise NotSupported("Not Supported")  # what NVML answers for a GPU in MIG mode

    fake.nvmlDeviceGetUtilizationRates = no_utilization
    samples = NvmlReader(fake).sample()

    assert [(s.temperature_c, s.utilization_pct, s.memory_used_mib, s.xid_errors) for s in samples] == \
        [(41, 0, 2048, 0), (41, 0, 2048, 0)]

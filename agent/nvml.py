"""GPU readings from NVML (the `nvidia-ml-py` package, imported only when needed).

What NVML gives and what it does not:
- temperature (GPU sensor, °C), utilisation (% of time a kernel ran), memory used (MiB): direct.
- ECC errors: NVML's *uncorrected, volatile* total (since the driver was loaded). GPUs without
  ECC, or with ECC turned off, report 0.
- XID errors: NVML keeps no XID counter. The agent registers for XID critical-error events
  and counts those it receives from its start; so the count restarts at 0 with the agent and
  misses XIDs raised while it was not running (the kernel log, `NVRM: Xid`, has the full
  history). Where events are not supported, it reports 0.
- Utilisation is 0 on a GPU in MIG mode (NVML does not measure it there).
- A GPU NVML can no longer read (e.g. fallen off the bus) reports 0 °C, 0 %, 0 MiB, its last
  ECC count, and one more XID error than before.
"""

import logging
import re
from dataclasses import dataclass

from agent.heartbeat import GpuSample

log = logging.getLogger("ibex-agent")


class NvmlUnavailable(Exception):
    """No NVML here: the package is missing or no NVIDIA driver is loaded."""


@dataclass
class GpuInventory:
    gpu_model: str
    driver_version: str
    gpus: list[dict]  # {"index", "uuid", "memory_mib"} for registration


def open_nvml() -> "NvmlReader":
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("the nvidia-ml-py package is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML is not available ({error}); is the NVIDIA driver installed?") from None
    return NvmlReader(pynvml)


# Memory sizes GPUs are sold with; NVML reports a little less (reserved memory), so a GPU's
# size is the smallest of these that holds what NVML reports.
MARKETED_SIZES_GB = (8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 288)


def model_name(nvml_name: str, memory_mib: int) -> str:
    """`NVIDIA H100 80GB HBM3` -> `H100-80GB`; `NVIDIA H200` (143771 MiB) -> `H200-141GB`.

    Best effort: the memory size comes from the name if it is there, else from NVML's total.
    Pass --gpu-model where the server knows the model by another name.
    """
    name = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", nvml_name.strip(), flags=re.IGNORECASE)
    family = re.match(r"[A-Za-z]*\d+[A-Za-z]*", name)
    size = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
    gigabytes = int(size.group(1)) if size else _marketed_size_gb(memory_mib)
    return f"{(family.group(0) if family else name).upper()}-{gigabytes}GB"


def _marketed_size_gb(memory_mib: int) -> int:
    reported_gb = memory_mib / 1024
    return next((size for size in MARKETED_SIZES_GB if size >= reported_gb - 0.5), round(reported_gb))


class NvmlReader:
    def __init__(self, pynvml) -> None:
        self.nvml = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.ecc_last = [0] * count
        self.xid_counts = [0] * count
        self.unreadable: set[int] = set()
        self.events = self._register_xid_events()

    def _register_xid_events(self):
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for handle in self.handles:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            return events
        except nvml.NVMLError as error:
            log.warning("NVML cannot report XID events (%s); reporting xid_errors 0", error)
            return None

    def inventory(self) -> GpuInventory:
        nvml = self.nvml
        gpus = []
        for index, handle in enumerate(self.handles):
            memory_mib = nvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            gpus.append({"index": index, "uuid": _text(nvml.nvmlDeviceGetUUID(handle)), "memory_mib": memory_mib})
        name = _text(nvml.nvmlDeviceGetName(self.handles[0])) if self.handles else "unknown"
        return GpuInventory(
            gpu_model=model_name(name, gpus[0]["memory_mib"] if gpus else 0),
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            gpus=gpus,
        )

    def sample(self) -> list[GpuSample]:
        self._drain_xid_events()
        return [self._sample_one(index, handle) for index, handle in enumerate(self.handles)]

    def _sample_one(self, index: int, handle) -> GpuSample:
        nvml = self.nvml
        try:
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            utilization = self._utilization(handle)
            memory_used = nvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
        except nvml.NVMLError as error:
            if index not in self.unreadable:
                self.unreadable.add(index)
                self.xid_counts[index] += 1
                log.warning("GPU %d cannot be read (%s); reporting it as failed", index, error)
            return GpuSample(index, 0, 0, 0, self.ecc_last[index], self.xid_counts[index])
        self.unreadable.discard(index)
        self.ecc_last[index] = self._ecc_errors(handle)
        return GpuSample(index, int(temperature), int(utilization), int(memory_used),
                         self.ecc_last[index], self.xid_counts[index])

    def _utilization(self, handle) -> int:
        """0 where NVML does not measure it: a GPU in MIG mode answers Not Supported, which
        is no sign of a failing GPU."""
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError as error:
            if isinstance(error, getattr(nvml, "NVMLError_NotSupported", ())):
                return 0
            raise

    def _ecc_errors(self, handle) -> int:
        nvml = self.nvml
        try:
            return int(nvml.nvmlDeviceGetTotalEccErrors(
                handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ))
        except nvml.NVMLError:
            return 0  # ECC not supported or turned off

    def _drain_xid_events(self) -> None:
        """Count the XID events that arrived since the last heartbeat, without waiting."""
        nvml = self.nvml
        if self.events is None:
            return
        while True:
            try:
                event = nvml.nvmlEventSetWait(self.events, 0)
            except nvml.NVMLError:
                return  # NVML_ERROR_TIMEOUT: nothing more queued
            try:
                index = nvml.nvmlDeviceGetIndex(event.device)
            except nvml.NVMLError:
                continue
            if 0 <= index < len(self.xid_counts):
                self.xid_counts[index] += 1
                log.warning("GPU %d raised XID %d", index, event.eventData)

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nvml.nvmlEventSetFree(self.events)
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

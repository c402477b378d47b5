"""A stand-in for `pynvml`'s MIG calls: H100-80GB GPUs whose GPU and compute instances live in
memory, with placements checked as the driver checks them (legal start, free slots), every
call recorded in order, and failures injectable per call (`fail["nvmlGpuInstanceDestroy"] =
NVML_ERROR_IN_USE`).
"""

import types
from dataclasses import dataclass, field

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
MESSAGES = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_IN_USE: "In use by another client",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's name
    def __init__(self, value: int = NVML_ERROR_NOT_FOUND) -> None:
        super().__init__(value)


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    def __init__(self, value: int = NVML_ERROR_NOT_SUPPORTED) -> None:
        super().__init__(value)


def error(value: int) -> NVMLError:
    return {NVML_ERROR_NOT_FOUND: NVMLError_NotFound, NVML_ERROR_NOT_SUPPORTED: NVMLError_NotSupported}.get(
        value, NVMLError)(value)


# constant -> (profile id, compute slices, memory slots, MiB, legal starts, name): an H100-80GB
GI_PROFILES = {
    0x0: (19, 1, 1, 9856, tuple(range(7)), "MIG 1g.10gb"),
    0x1: (14, 2, 2, 20096, (0, 2, 4), "MIG 2g.20gb"),
    0x2: (9, 3, 4, 40320, (0, 4), "MIG 3g.40gb"),
    0x3: (5, 4, 4, 40320, (0,), "MIG 4g.40gb"),
    0x4: (0, 7, 8, 80896, (0,), "MIG 7g.80gb"),
    0x7: (20, 1, 1, 9856, tuple(range(7)), "MIG 1g.10gb+me"),
    0x9: (15, 1, 2, 20096, (0, 2, 4, 6), "MIG 1g.20gb"),
}


@dataclass
class GpuInstance:
    gpu: int
    id: int
    profile_id: int
    start: int
    size: int
    compute: int
    compute_instances: dict[int, "ComputeInstance"] = field(default_factory=dict)


@dataclass
class ComputeInstance:
    gpu_instance: GpuInstance
    id: int


@dataclass
class MigDevice:
    gpu: int
    gpu_instance: int
    compute_instance: int


class FakeNvml:
    """Module-like: attributes are pynvml's names."""

    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported

    def __init__(self, gpus: int = 2, mig_enabled: bool = True, v2_names: bool = True) -> None:
        self.calls: list[tuple] = []
        self.fail: dict[str, int] = {}  # call name -> NVML error to raise (every time)
        self.mig_mode = [self.NVML_DEVICE_MIG_ENABLE if mig_enabled else self.NVML_DEVICE_MIG_DISABLE] * gpus
        self.pending_mode = list(self.mig_mode)
        self.gpus = gpus
        self.v2_names = v2_names
        self.instances: dict[tuple[int, int], GpuInstance] = {}  # (gpu, gi id) -> instance
        self.next_gi = 1
        for constant, value in [("NVML_GPU_INSTANCE_PROFILE_1_SLICE", 0x0), ("NVML_GPU_INSTANCE_PROFILE_2_SLICE", 0x1),
                                ("NVML_GPU_INSTANCE_PROFILE_3_SLICE", 0x2), ("NVML_GPU_INSTANCE_PROFILE_4_SLICE", 0x3),
                                ("NVML_GPU_INSTANCE_PROFILE_7_SLICE", 0x4), ("NVML_GPU_INSTANCE_PROFILE_8_SLICE", 0x5),
                                ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1", 0x7),
                                ("NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2", 0x9),
                                ("NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE", 0x0),
                                ("NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE", 0x1),
                                ("NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE", 0x2),
                                ("NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE", 0x3),
                                ("NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE", 0x4)]:
            setattr(self, constant, value)

    # helpers for tests

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    def slices(self, gpu: int = 0) -> list[tuple[int, int, int]]:
        """(start, size, compute instances) of the GPU instances on a GPU."""
        return sorted((gi.start, gi.size, len(gi.compute_instances))
                      for (index, _), gi in self.instances.items() if index == gpu)

    def _record(self, name: str, *args) -> None:
        self.calls.append((name, *args))
        if name in self.fail:
            raise error(self.fail[name])

    # pynvml

    def nvmlInit(self) -> None:
        self._record("nvmlInit")

    def nvmlShutdown(self) -> None:
        self._record("nvmlShutdown")

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._record("nvmlDeviceGetMigMode", handle)
        return [self.mig_mode[handle], self.pending_mode[handle]]

    def nvmlDeviceSetMigMode(self, handle: int, mode: int) -> int:
        self._record("nvmlDeviceSetMigMode", handle, mode)
        self.mig_mode[handle] = self.pending_mode[handle] = mode
        return 0

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, profile: int, version: int = 2):
        self._record("nvmlDeviceGetGpuInstanceProfileInfo", handle, profile)
        if self.mig_mode[handle] != self.NVML_DEVICE_MIG_ENABLE or profile not in GI_PROFILES:
            raise error(NVML_ERROR_NOT_SUPPORTED)
        profile_id, compute, _slots, memory, _starts, name = GI_PROFILES[profile]
        info = types.SimpleNamespace(id=profile_id, sliceCount=compute, memorySizeMB=memory, instanceCount=7)
        if self.v2_names:
            info.name = name.encode()
        return info

    @staticmethod
    def c_nvmlGpuInstancePlacement_t():
        return types.SimpleNamespace(start=0, size=0)

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: int, profile_id: int, placement):
        self._record("nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile_id, placement.start, placement.size)
        shape = next((p for p in GI_PROFILES.values() if p[0] == profile_id), None)
        if shape is None or placement.start not in shape[4] or placement.size != shape[2]:
            raise error(NVML_ERROR_INVALID_ARGUMENT)
        wanted = set(range(placement.start, placement.start + placement.size))
        for (gpu, _), gi in self.instances.items():
            if gpu == handle and wanted & set(range(gi.start, gi.start + gi.size)):
                raise error(NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = GpuInstance(handle, self.next_gi, profile_id, placement.start, placement.size, shape[1])
        self.next_gi += 1
        self.instances[(handle, gi.id)] = gi
        return gi

    def nvmlGpuInstanceGetInfo(self, gi: GpuInstance):
        self._record("nvmlGpuInstanceGetInfo", gi.id)
        return types.SimpleNamespace(id=gi.id, profileId=gi.profile_id,
                                     placement=types.SimpleNamespace(start=gi.start, size=gi.size))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi: GpuInstance, profile: int, engine: int, version=2):
        self._record("nvmlGpuInstanceGetComputeInstanceProfileInfo", gi.id, profile, engine)
        compute = {0x0: 1, 0x1: 2, 0x2: 3, 0x3: 4, 0x4: 7}[profile]
        if compute > gi.compute:
            raise error(NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(id=100 + profile, sliceCount=compute)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: GpuInstance, profile_id: int):
        self._record("nvmlGpuInstanceCreateComputeInstance", gi.id, profile_id)
        if gi.compute_instances:
            raise error(NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci = ComputeInstance(gi, 0)
        gi.compute_instances[ci.id] = ci
        return ci

    def nvmlComputeInstanceGetInfo(self, ci: ComputeInstance):
        self._record("nvmlComputeInstanceGetInfo", ci.gpu_instance.id)
        return types.SimpleNamespace(id=ci.id)

    def _mig_devices(self, handle: int) -> list[MigDevice]:
        return [MigDevice(handle, gi.id, ci.id) for (gpu, _), gi in sorted(self.instances.items())
                if gpu == handle for ci in gi.compute_instances.values()]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:
        self._record("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, position: int) -> MigDevice:
        self._record("nvmlDeviceGetMigDeviceHandleByIndex", handle, position)
        devices = self._mig_devices(handle)
        if position >= len(devices):
            raise error(NVML_ERROR_NOT_FOUND)
        return devices[position]

    def nvmlDeviceGetGpuInstanceId(self, device: MigDevice) -> int:
        return device.gpu_instance

    def nvmlDeviceGetComputeInstanceId(self, device: MigDevice) -> int:
        return device.compute_instance

    def nvmlDeviceGetUUID(self, device) -> bytes:
        if isinstance(device, MigDevice):
            return f"MIG-fake-{device.gpu}-{device.gpu_instance}-{device.compute_instance}".encode()
        return f"GPU-fake-{device}".encode()

    def nvmlDeviceGetGpuInstanceById(self, handle: int, gi_id: int) -> GpuInstance:
        self._record("nvmlDeviceGetGpuInstanceById", handle, gi_id)
        if (handle, gi_id) not in self.instances:
            raise error(NVML_ERROR_NOT_FOUND)
        return self.instances[(handle, gi_id)]

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: GpuInstance, ci_id: int) -> ComputeInstance:
        self._record("nvmlGpuInstanceGetComputeInstanceById", gi.id, ci_id)
        if ci_id not in gi.compute_instances:
            raise error(NVML_ERROR_NOT_FOUND)
        return gi.compute_instances[ci_id]

    def nvmlComputeInstanceDestroy(self, ci: ComputeInstance) -> None:
        self._record("nvmlComputeInstanceDestroy", ci.gpu_instance.id, ci.id)
        del ci.gpu_instance.compute_instances[ci.id]

    def nvmlGpuInstanceDestroy(self, gi: GpuInstance) -> None:
        self._record("nvmlGpuInstanceDestroy", gi.id)
        if gi.compute_instances:
            raise error(NVML_ERROR_IN_USE)
        del self.instances[(gi.gpu, gi.id)]

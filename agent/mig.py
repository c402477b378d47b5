"""MIG slices through NVML: create a GPU instance and its compute instance at a placement,
find the MIG device's UUID, and destroy both again.

`MigControl` takes the NVML module (`pynvml`, or a stand-in in the tests) and the parent GPUs'
handles, so nothing here imports NVML itself. Every failure is a `MigError` whose message is
the NVML call that failed and what NVML said (`nvmlDeviceCreateGpuInstanceWithPlacement:
Insufficient Resources`), or the check that refused (`MIG mode is not enabled on GPU 0`).

Profile names are IBEX's (`1g.10gb`, `1g.20gb`, `3g.40gb` on an H100-80GB): `<N>g` is the
compute slices (sevenths of the SMs) and `<M>gb` the memory. The GPU instance profile is the
NVML one with that many compute slices whose name (NVML 12+: `MIG 1g.10gb`) is the name, else
whose memory is nearest to M GB; that tells `1g.10gb` (one memory slot) from the
double-memory `1g.20gb` (two). The placement's size is the profile's memory slots, out of 8.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

PROFILE_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")
POSITIONS = 8

# NVML GPU instance profile constant name -> (compute slices, memory slots, legal starts);
# the shapes the MIG user guide gives for A100/H100/H200 (the `+me` media-extension
# variants are not sold by IBEX)
GPU_INSTANCE_PROFILES = {
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE": (1, 1, tuple(range(7))),
    "NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2": (1, 2, (0, 2, 4, 6)),
    "NVML_GPU_INSTANCE_PROFILE_2_SLICE": (2, 2, (0, 2, 4)),
    "NVML_GPU_INSTANCE_PROFILE_3_SLICE": (3, 4, (0, 4)),
    "NVML_GPU_INSTANCE_PROFILE_4_SLICE": (4, 4, (0,)),
    "NVML_GPU_INSTANCE_PROFILE_7_SLICE": (7, 8, (0,)),
}
# a compute instance spanning its whole GPU instance
COMPUTE_INSTANCE_PROFILES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
}


class MigError(Exception):
    """A slice could not be made or removed; the message is NVML's (or the check's)."""


@dataclass(frozen=True)
class MigSlice:
    uuid: str  # MIG-<uuid>: what CUDA_VISIBLE_DEVICES takes
    gpu_instance_id: int
    compute_instance_id: int


@dataclass(frozen=True)
class GpuInstanceProfile:
    constant: str  # e.g. NVML_GPU_INSTANCE_PROFILE_1_SLICE
    profile_id: int  # NVML's id for it on this GPU
    name: str  # e.g. 1g.10gb
    compute: int
    slots: int
    starts: tuple[int, ...]
    memory_mib: int


def parse_profile_name(name: str) -> tuple[int, int]:
    """`1g.10gb` -> (1, 10); MigError if it is not such a name."""
    match = PROFILE_NAME.match(name or "")
    if not match:
        raise MigError(f"{name!r} is not a MIG profile name like 1g.10gb")
    return int(match.group(1)), int(match.group(2))


def legal_start(compute: int, start: int) -> bool:
    """Whether some profile with that many compute slices may start at `start` (for checks
    that do not know the GPU: the simulated agent)."""
    return any(shape[0] == compute and start in shape[2] for shape in GPU_INSTANCE_PROFILES.values())


class MigControl:
    def __init__(self, nvml, handles: list, trace: Callable[[str], None] | None = None) -> None:
        self.nvml = nvml
        self.handles = handles
        self.trace = trace or (lambda line: None)

    def _call(self, name: str, *args, quiet_errors: tuple = ()):
        """One NVML call, traced; NVMLError becomes MigError('<call>: <what NVML said>')."""
        nvml = self.nvml
        try:
            result = getattr(nvml, name)(*args)
        except nvml.NVMLError as error:
            if not isinstance(error, quiet_errors):
                self.trace(f"{name}: {error}")
            raise MigError(f"{name}: {error}") from error
        self.trace(f"{name}: ok{_describe(result)}")
        return result

    def handle(self, index: int):
        if not 0 <= index < len(self.handles):
            raise MigError(f"GPU {index} is not on this node ({len(self.handles)} GPUs)")
        return self.handles[index]

    def mig_enabled(self, index: int) -> bool:
        current, _pending = self._call("nvmlDeviceGetMigMode", self.handle(index))
        return current == self.nvml.NVML_DEVICE_MIG_ENABLE

    def profiles(self, index: int) -> list[GpuInstanceProfile]:
        """The GPU instance profiles this GPU offers, of the shapes IBEX sells."""
        nvml, handle = self.nvml, self.handle(index)
        found = []
        for constant, (compute, slots, starts) in GPU_INSTANCE_PROFILES.items():
            if not hasattr(nvml, constant):
                continue
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", handle, getattr(nvml, constant),
                                  quiet_errors=(nvml.NVMLError,))
            except MigError:
                continue  # not on this GPU
            if int(info.sliceCount) != compute:
                continue
            memory_mib = int(info.memorySizeMB)
            name = _text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
            if not PROFILE_NAME.match(name):
                name = f"{compute}g.{-(-memory_mib // 1024)}gb"
            found.append(GpuInstanceProfile(constant, int(info.id), name, compute, slots, starts, memory_mib))
        return found

    def profile(self, index: int, name: str) -> GpuInstanceProfile:
        compute, gigabytes = parse_profile_name(name)
        candidates = [p for p in self.profiles(index) if p.compute == compute]
        if not candidates:
            raise MigError(f"GPU {index} has no MIG profile with {compute} compute slices ({name})")
        exact = [p for p in candidates if p.name == name]
        if exact:
            return exact[0]
        return min(candidates, key=lambda p: abs(p.memory_mib - gigabytes * 1024))

    def create(self, index: int, profile_name: str, start: int) -> MigSlice:
        """A GPU instance of the profile at `start` and a compute instance spanning it; on a
        failure half way, what was made is destroyed again."""
        nvml = self.nvml
        handle = self.handle(index)
        if not self.mig_enabled(index):
            raise MigError(f"MIG mode is not enabled on GPU {index}")
        profile = self.profile(index, profile_name)
        if start not in profile.starts:
            raise MigError(f"{profile_name} cannot start at memory slot {start} "
                           f"(legal starts: {', '.join(map(str, profile.starts))})")
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, profile.slots
        gpu_instance = self._call("nvmlDeviceCreateGpuInstanceWithPlacement", handle, profile.profile_id, placement)
        try:
            gi_id = int(self._call("nvmlGpuInstanceGetInfo", gpu_instance).id)
            ci_info = self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", gpu_instance,
                                 getattr(nvml, COMPUTE_INSTANCE_PROFILES[profile.compute]),
                                 nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
            compute_instance = self._call("nvmlGpuInstanceCreateComputeInstance", gpu_instance, int(ci_info.id))
        except MigError:
            self._quietly("nvmlGpuInstanceDestroy", gpu_instance)
            raise
        try:
            ci_id = int(self._call("nvmlComputeInstanceGetInfo", compute_instance).id)
            uuid = self.mig_uuid(index, gi_id, ci_id)
        except MigError:
            self._quietly("nvmlComputeInstanceDestroy", compute_instance)
            self._quietly("nvmlGpuInstanceDestroy", gpu_instance)
            raise
        return MigSlice(uuid, gi_id, ci_id)

    def mig_uuid(self, index: int, gi_id: int, ci_id: int) -> str:
        """The UUID of the MIG device of that GPU instance and compute instance."""
        nvml, handle = self.nvml, self.handle(index)
        count = self._call("nvmlDeviceGetMaxMigDeviceCount", handle)
        for position in range(int(count)):
            try:
                device = self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, position,
                                    quiet_errors=(nvml.NVMLError,))
            except MigError:
                continue  # no MIG device at this position
            if (int(self._call("nvmlDeviceGetGpuInstanceId", device)) == gi_id
                    and int(self._call("nvmlDeviceGetComputeInstanceId", device)) == ci_id):
                return _text(self._call("nvmlDeviceGetUUID", device))
        raise MigError(f"no MIG device on GPU {index} for GPU instance {gi_id}, compute instance {ci_id}")

    def destroy(self, index: int, gi_id: int, ci_id: int | None) -> None:
        """Destroy the compute instance, then the GPU instance. One already gone is no error
        (someone else removed it, or an earlier try got half way)."""
        nvml, handle = self.nvml, self.handle(index)
        not_found = nvml.NVMLError_NotFound
        try:
            gpu_instance = self._call("nvmlDeviceGetGpuInstanceById", handle, gi_id, quiet_errors=(not_found,))
        except MigError as error:
            if not isinstance(error.__cause__, not_found):
                raise
            self.trace(f"GPU instance {gi_id} on GPU {index} is already gone")
            return
        if ci_id is not None:
            try:
                compute_instance = self._call("nvmlGpuInstanceGetComputeInstanceById", gpu_instance, ci_id,
                                              quiet_errors=(not_found,))
            except MigError as error:
                if not isinstance(error.__cause__, not_found):
                    raise
                self.trace(f"compute instance {ci_id} of GPU instance {gi_id} is already gone")
            else:
                self._call("nvmlComputeInstanceDestroy", compute_instance)
        self._call("nvmlGpuInstanceDestroy", gpu_instance)

    def _quietly(self, name: str, *args) -> None:
        try:
            self._call(name, *args)
        except MigError:
            pass  # already failing: the first error is the one to report


def _describe(result) -> str:
    if result is None or isinstance(result, int | str | bytes | list | tuple):
        return "" if result is None else f" -> {_text(result) if isinstance(result, bytes) else result}"
    fields = [name for name in ("id", "sliceCount", "memorySizeMB") if hasattr(result, name)]
    return f" -> {', '.join(f'{name}={getattr(result, name)}' for name in fields)}" if fields else ""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

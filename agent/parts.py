"""Parts of GPUs: MIG slices and shares a lease gets instead of whole GPUs.

A `start` action may carry `parts`, one per part on this node:
    {"index": 0, "mig_profile": "1g.10gb", "start": 0}        a MIG slice at memory slot 0
    {"index": 1, "share": 250, "memory_mib": 20480}           250 thousandths of GPU 1
and the heartbeat reports, for every lease served with parts, one device per part in the
order of `parts` (`devices: {lease: [device, ...]}`):
    {"index": 0, "mig_profile": "1g.10gb", "start": 0, "uuid": "MIG-...", "enforced": true, "error": ""}
    {"index": 1, "share": 250, "memory_mib": 20480, "enforced": false, "error": "no MPS control daemon ..."}

`PartsManager` keeps the devices of each lease (in the state file, so a restarted agent still
destroys its slices), sets them up through an `Enforcer` when a lease starts and tears them
down once the lease's processes are gone. Enforcers: `NodeEnforcer` (NVML's MIG calls, the
MPS control daemon's pipe) and `SimulatedEnforcer` (deterministic UUIDs, always enforced).
"""

import logging
import os
import stat
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from agent.mig import MigControl, MigError, legal_start, parse_profile_name

log = logging.getLogger("ibex-agent")

DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"
MAX_SHARE = 999  # thousandths; a whole GPU is sold whole
_SIMULATED_NAMESPACE = uuid.UUID("0d5c3f1e-8a47-4b2e-9c61-7e2f4a9b8d30")


@dataclass(frozen=True)
class Part:
    index: int
    mig_profile: str | None = None
    start: int | None = None
    share: int | None = None
    memory_mib: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.mig_profile is not None

    def as_dict(self) -> dict:
        if self.is_mig:
            return {"index": self.index, "mig_profile": self.mig_profile, "start": self.start}
        return {"index": self.index, "share": self.share, "memory_mib": self.memory_mib}

    def describe(self) -> str:
        if self.is_mig:
            return f"MIG {self.mig_profile} at slot {self.start} of GPU {self.index}"
        return f"{self.share}/1000 of GPU {self.index}"


def parse_parts(data: object) -> list[Part]:
    """The `parts` of a start action; TypeError/ValueError when it is not a list of parts.
    Values out of range (a share of 2000, an unknown profile) parse: they are reported as
    not enforced, with the reason, rather than refusing the whole answer."""
    if not isinstance(data, list):
        raise TypeError("parts is not a list")
    return [_part(item) for item in data]


def _part(item: object) -> Part:
    if not isinstance(item, dict):
        raise TypeError("a part is not an object")
    index = _int(item["index"])
    if "mig_profile" in item:
        profile = item["mig_profile"]
        if not isinstance(profile, str):
            raise TypeError("mig_profile is not a string")
        return Part(index, mig_profile=profile, start=_int(item["start"]))
    return Part(index, share=_int(item["share"]), memory_mib=_int(item["memory_mib"]))


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an integer")
    return value


@dataclass
class Device:
    """What the agent made of one part: the heartbeat's device, plus the MIG instance ids it
    needs to destroy the slice (not reported)."""

    part: dict  # Part.as_dict()
    enforced: bool = False
    error: str = ""
    uuid: str = ""  # MIG only
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "Device":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @property
    def spec(self) -> Part:
        return _part(self.part)

    @property
    def made(self) -> bool:
        """Something exists on the GPU that must be destroyed at the end."""
        return self.gpu_instance_id is not None

    def report(self) -> dict:
        report = dict(self.part)
        if self.spec.is_mig:
            report["uuid"] = self.uuid
        report.update(enforced=self.enforced, error=self.error)
        return report


def check_part(part: Part) -> str:
    """Why the part cannot be set up whatever the node ('' when it can be tried)."""
    if part.index < 0:
        return f"GPU index {part.index} is negative"
    if part.is_mig:
        try:
            compute, _ = parse_profile_name(part.mig_profile or "")
        except MigError as error:
            return str(error)
        if not legal_start(compute, 0):
            return f"no MIG profile has {compute} compute slices ({part.mig_profile})"
        if not legal_start(compute, part.start if part.start is not None else -1):
            return f"{part.mig_profile} cannot start at memory slot {part.start}"
        return ""
    if not 1 <= (part.share or 0) <= MAX_SHARE:
        return f"share must be 1-{MAX_SHARE} thousandths, not {part.share}"
    if (part.memory_mib or 0) < 1:
        return f"memory_mib must be positive, not {part.memory_mib}"
    return ""


class Enforcer(ABC):
    """Makes parts real on the GPUs (or pretends to): `NodeEnforcer`, `SimulatedEnforcer`."""

    @abstractmethod
    def set_up(self, part: Part) -> Device:
        """Make the part (a MIG instance, MPS limits) and say how it went."""

    def tear_down(self, device: Device) -> None:
        """Remove what set_up made; MigError to be tried again later. (Nothing by default.)"""
        return None

    def refresh(self, device: Device) -> None:
        """Re-check a device whose enforcement may change by itself (the MPS daemon).
        (Nothing by default.)"""
        return None

    def mps_pipe_directory(self) -> str | None:
        """Where the lease's processes find the MPS control daemon, to pass on to them."""
        return None


def mps_pipe_directory() -> str:
    return os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY


def mps_daemon_trouble(pipe_directory: str) -> str:
    """'' when an MPS control daemon listens on `pipe_directory` (its `control` pipe is
    there), else why not."""
    control = Path(pipe_directory) / "control"
    try:
        if stat.S_ISFIFO(control.stat().st_mode):
            return ""
    except OSError:
        pass
    return f"no MPS control daemon on this node (no control pipe {control}): share not enforced"


class NodeEnforcer(Enforcer):
    """The real node: MIG through NVML (`mig` None where NVML is unavailable, `nvml_trouble`
    saying why), shares through the MPS control daemon's environment variables."""

    def __init__(self, mig: MigControl | None, nvml_trouble: str = "",
                 pipe_directory: str | None = None) -> None:
        self.mig = mig
        self.nvml_trouble = nvml_trouble or "NVML is not available"
        self.pipe_directory = pipe_directory or mps_pipe_directory()

    def set_up(self, part: Part) -> Device:
        device = Device(part.as_dict())
        problem = check_part(part)
        if problem:
            device.error = problem
            return device
        if not part.is_mig:
            self.refresh(device)
            return device
        if self.mig is None:
            device.error = f"{self.nvml_trouble}: MIG slice not created"
            return device
        try:
            made = self.mig.create(part.index, part.mig_profile or "", part.start or 0)
        except MigError as error:
            device.error = str(error)
            return device
        device.enforced, device.uuid = True, made.uuid
        device.gpu_instance_id, device.compute_instance_id = made.gpu_instance_id, made.compute_instance_id
        return device

    def tear_down(self, device: Device) -> None:
        if not device.made:
            return
        if self.mig is None:
            raise MigError(f"{self.nvml_trouble}: cannot destroy GPU instance {device.gpu_instance_id}")
        self.mig.destroy(device.spec.index, device.gpu_instance_id or 0, device.compute_instance_id)

    def refresh(self, device: Device) -> None:
        if device.spec.is_mig or check_part(device.spec):
            return
        trouble = mps_daemon_trouble(self.pipe_directory)
        device.enforced, device.error = not trouble, trouble

    def mps_pipe_directory(self) -> str | None:
        return self.pipe_directory


class SimulatedEnforcer(Enforcer):
    """`ibex-agent simulate` and `run --simulate-gpus`: every valid part is enforced, a MIG
    slice gets `MIG-<uuid5 of host, GPU, profile, start>` (the same on every run)."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname

    def set_up(self, part: Part) -> Device:
        device = Device(part.as_dict())
        device.error = check_part(part)
        device.enforced = not device.error
        if device.enforced and part.is_mig:
            device.uuid = simulated_mig_uuid(self.hostname, part)
        return device


def simulated_mig_uuid(hostname: str, part: Part) -> str:
    key = f"{hostname}/{part.index}/{part.mig_profile}/{part.start}"
    return f"MIG-{uuid.uuid5(_SIMULATED_NAMESPACE, key)}"


@dataclass
class LeaseParts:
    devices: list[Device] = field(default_factory=list)
    releasing: bool = False  # the lease stopped: destroy once its processes are gone
    trouble: str = ""  # why tearing down failed last time (said once)


class PartsManager:
    def __init__(self, enforcer: Enforcer, records: dict[str, dict] | None = None,
                 save: Callable[[], None] = lambda: None, lock=None) -> None:
        self.enforcer = enforcer
        self.save = save
        self.lock = lock or threading.RLock()
        self.leases: dict[str, LeaseParts] = {}
        self.retired: list[tuple[str, Device]] = []  # replaced parts of a running lease
        for lease, record in (records or {}).items():
            try:
                devices = [Device.from_dict(item) for item in record.get("devices") or []]
                # slices a running lease no longer uses: an agent that restarts must still
                # destroy them once the lease's processes are gone
                self.retired += [(lease, Device.from_dict(item))
                                 for item in record.get("retired") or []]
                if devices or record.get("releasing"):
                    self.leases[lease] = LeaseParts(devices,
                                                    releasing=bool(record.get("releasing")))
            except (TypeError, AttributeError):
                log.warning("lease %s: its parts in the state file are unreadable; left alone", lease)

    # the heartbeat's view

    def reports(self) -> dict[str, list[dict]]:
        """`devices` for the heartbeat: every lease with parts, until they are torn down."""
        with self.lock:
            for held in self.leases.values():
                for device in held.devices:
                    self.enforcer.refresh(device)
            return {lease: [d.report() for d in held.devices]
                    for lease, held in sorted(self.leases.items()) if held.devices}

    def tearing_down(self) -> set[str]:
        """Stopped leases whose slices are not destroyed yet: still in `serving`."""
        with self.lock:
            return {lease for lease, held in self.leases.items() if held.releasing}

    def devices_for(self, lease: str) -> list[dict] | None:
        """The lease's device reports, in the order of its parts; None: whole GPUs."""
        with self.lock:
            held = self.leases.get(lease)
            return [d.report() for d in held.devices] if held and not held.releasing else None

    def snapshot(self) -> dict[str, dict]:
        with self.lock:
            records = {lease: {"devices": [asdict(d) for d in held.devices],
                               "releasing": held.releasing}
                       for lease, held in self.leases.items()}
            for lease, device in self.retired:
                record = records.setdefault(lease, {"devices": [], "releasing": False})
                record.setdefault("retired", []).append(asdict(device))
            return records

    # actions

    def apply(self, actions: list, who: str = "") -> bool:
        """Set up the parts of started leases, mark stopped ones for teardown; True if what
        we report changed."""
        changed = False
        with self.lock:
            for action in actions:
                if action.action == "start":
                    changed |= self._start(action.lease, action.parts)
                elif action.action == "stop":
                    held = self.leases.get(action.lease)
                    if held and not held.releasing:
                        held.releasing = True
                        changed = True
        if changed:
            self.save()
        return changed

    def _start(self, lease: str, parts: list[Part] | None) -> bool:
        held = self.leases.get(lease)
        if held is not None and held.releasing:
            return False  # stopped: a late repeat of its start changes nothing
        wanted = [part.as_dict() for part in parts or []]
        if held is not None and [d.part for d in held.devices] == wanted:
            return self._retry_failed(lease, held)
        if held is not None:  # other parts than before: the old ones go once unused
            log.info("lease %s: parts changed; replacing them", lease)
            self.retired += [(lease, device) for device in held.devices if device.made]
            del self.leases[lease]
        if not parts:
            return held is not None
        held = LeaseParts([self._set_up(lease, part) for part in parts])
        self.leases[lease] = held
        return True

    def _set_up(self, lease: str, part: Part) -> Device:
        device = self.enforcer.set_up(part)
        if device.enforced:
            log.info("lease %s: %s%s", lease, part.describe(), f" is {device.uuid}" if device.uuid else " enforced")
        else:
            log.warning("lease %s: %s not enforced: %s", lease, part.describe(), device.error)
        return device

    def _retry_failed(self, lease: str, held: LeaseParts) -> bool:
        """A repeated start: try again the MIG slices that could not be made."""
        changed = False
        for position, device in enumerate(held.devices):
            if device.enforced or not device.spec.is_mig or device.made:
                continue
            again = self._set_up(lease, device.spec)
            if again.report() != device.report():
                held.devices[position] = again
                changed = True
        return changed

    def release(self, busy: Callable[[str], bool] = lambda lease: False) -> bool:
        """Destroy the slices of stopped leases whose processes are gone (`busy(lease)` is
        False); True when a lease's parts are all gone (it leaves `serving`)."""
        with self.lock:
            retired = len(self.retired)
            self.retired = [(lease, d) for lease, d in self.retired if not self._destroyed(lease, d, busy)]
            destroyed_retired = len(self.retired) < retired
            done = []
            for lease, held in self.leases.items():
                if not held.releasing or busy(lease):
                    continue
                held.devices = [d for d in held.devices if not self._destroyed(lease, d, busy, held)]
                if not held.devices:
                    done.append(lease)
            for lease in done:
                del self.leases[lease]
                log.info("lease %s: its GPU parts are released", lease)
        if done or destroyed_retired:
            self.save()
        return bool(done)

    def _destroyed(self, lease: str, device: Device, busy: Callable[[str], bool],
                   held: LeaseParts | None = None) -> bool:
        if not device.made:
            return True
        if held is None and busy(lease):
            return False  # a replaced slice: its lease still runs on it
        try:
            self.enforcer.tear_down(device)
        except MigError as error:
            if held is not None and held.trouble != str(error):
                held.trouble = str(error)
                log.warning("lease %s: cannot destroy its %s yet: %s; retrying", lease,
                            device.spec.describe(), error)
            return False
        log.info("lease %s: %s destroyed", lease, device.spec.describe())
        return True

"""Simulated GPU servers for machines without GPUs: plausible, seeded readings and failures.

Readings (per GPU, per heartbeat):
- idle: 30-40 °C, 0 % utilisation, 0-5 MiB memory used;
- busy (serving a lease): 60-75 °C, 90-100 % utilisation, 60-95 % of the GPU's memory used;
- failed (`fail_gpus` in the control file): the GPU "fell off the bus": `ecc_errors` 1,
  `xid_errors` 79 (the XID code for "GPU has fallen off the bus"), 0 % utilisation, 0 MiB used;
- degraded (`degrade_gpus`): `xid_errors` rises by one every heartbeat (as a GPU throwing
  XID 13/31/43 errors does) and the temperature is 90-95 °C; `ecc_errors` stays 0.
A GPU taken out of the control file reads healthy again (as after a GPU reset).

The control file is JSON, re-read every cycle and on SIGUSR1:
    {"fail_gpus": {"gpu03": [2]}, "degrade_gpus": {"gpu04": [1]}, "stop_heartbeats": ["gpu05"]}
A host in `stop_heartbeats` sends nothing until it is taken out again.

Parts of GPUs (a `start` with `parts`) are reported in `devices` like a real node's: every
valid part enforced, a MIG slice with a deterministic `MIG-<uuid>` (the same for the same host,
GPU, profile and start on every run); an invalid one (a share of 0, a 1g slice at slot 7) not
enforced, with the reason.

Workloads (`--runtime process`, the default) are pretended, never run: a `start` with a command
is reported `running` at once (rank 0 reports MASTER_PORT 29500), a few log lines say what
would run, and it `exited` with code 0 after the launch env's IBEX_SIMULATED_SECONDS (without
it, it runs until stopped); a notice or stop makes it `stopped`.
"""

import json
import random
import re
import time
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agent.errors import AgentError
from agent.heartbeat import Action, GpuSample, Leases, iso_utc
from agent.ibports import IbPort
from agent.launch import Launch, launch_env
from agent.parts import PartsManager, SimulatedEnforcer

SIMULATED_MASTER_PORT = 29500
SIGTERM_EXIT_CODE = 128 + 15

XID_FELL_OFF_THE_BUS = 79

# Usable memory as NVML reports it, for the common models; others are read from the name.
GPU_MEMORY_MIB = {
    "H100-80GB": 81559,
    "H100-94GB": 95830,
    "H200-141GB": 143771,
    "A100-80GB": 81920,
    "A100-40GB": 40960,
    "B200-180GB": 183359,
    "L40S-48GB": 46068,
}

_UUID_NAMESPACE = uuid.UUID("8f6b7c9e-1d2a-4c3b-9e8f-6a5b4c3d2e1f")


def gpu_memory_mib(gpu_model: str) -> int:
    if gpu_model in GPU_MEMORY_MIB:
        return GPU_MEMORY_MIB[gpu_model]
    match = re.search(r"(\d+)\s*GB", gpu_model, re.IGNORECASE)
    return int(match.group(1)) * 1024 if match else 81920


@dataclass(frozen=True)
class Control:
    fail_gpus: dict[str, frozenset[int]] = field(default_factory=dict)
    degrade_gpus: dict[str, frozenset[int]] = field(default_factory=dict)
    stop_heartbeats: frozenset[str] = frozenset()


def parse_control(data: object, source: str) -> Control:
    if not isinstance(data, dict):
        raise AgentError(f"{source}: expected a JSON object")
    try:
        return Control(
            fail_gpus=_gpu_map(data.get("fail_gpus")),
            degrade_gpus=_gpu_map(data.get("degrade_gpus")),
            stop_heartbeats=frozenset(str(host) for host in data.get("stop_heartbeats") or []),
        )
    except (TypeError, ValueError, AttributeError):
        raise AgentError(
            f"{source}: expected {{\"fail_gpus\": {{host: [gpu, ...]}}, "
            f"\"degrade_gpus\": {{host: [gpu, ...]}}, \"stop_heartbeats\": [host, ...]}}"
        ) from None


def _gpu_map(value: object) -> dict[str, frozenset[int]]:
    return {str(host): frozenset(int(i) for i in gpus) for host, gpus in (value or {}).items()}


class ControlFile:
    """The failure-rehearsal file; reloads when it changes or when asked (SIGUSR1)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.current = Control()
        self._file_stamp: tuple[float, int] | None = None

    def refresh(self, force: bool = False) -> bool:
        """Re-read the file if it changed (or `force`); True if the control changed.

        A missing file means no failures; a malformed one keeps the last good control and
        raises AgentError so the caller can log it.
        """
        if self.path is None:
            return False
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime, stat.st_size)
        except OSError:
            stamp = None
        if stamp == self._file_stamp and not force:
            return False
        self._file_stamp = stamp
        if stamp is None:
            control = Control()
        else:
            try:
                text = self.path.read_text()
                control = parse_control(json.loads(text) if text.strip() else {}, str(self.path))
            except (OSError, json.JSONDecodeError) as error:
                raise AgentError(f"cannot read control file {self.path}: {error}") from None
        changed = control != self.current
        self.current = control
        return changed


@dataclass
class SimulatedWorkload:
    lease: str
    generation: int
    started_at: str
    ends_at: float | None  # epoch seconds; None: until stopped
    master_port: int | None
    state: str = "running"
    exit_code: int | None = None
    ended_at: str | None = None
    next_line: int = 0  # the number of the first line in `lines`
    lines: list[str] = field(default_factory=list)  # not yet shipped

    def report(self) -> dict:
        return {"lease": self.lease, "generation": self.generation, "state": self.state,
                "exit_code": self.exit_code, "started_at": self.started_at, "ended_at": self.ended_at,
                "master_port": self.master_port, "error": ""}

    def end(self, state: str, exit_code: int, line: str) -> None:
        self.state, self.exit_code, self.ended_at = state, exit_code, _now()
        self.lines.append(line)


class SimulatedHost:
    """One simulated GPU server: its GPUs' readings, the leases it serves, its node identity."""

    def __init__(self, hostname: str, gpu_model: str, gpu_count: int, seed: int = 0) -> None:
        self.hostname = hostname
        self.gpu_model = gpu_model
        self.gpu_count = gpu_count
        self.memory_mib = gpu_memory_mib(gpu_model)
        # seeded per host, so a run is repeatable whatever order the threads take
        self.random = random.Random(seed * 1_000_003 + zlib.crc32(hostname.encode()))
        self.leases = Leases()
        self.xid_counts = [0] * gpu_count
        self.node_id: int | None = None
        self.token: str | None = None
        self.interval_s: float = 15.0
        self.failures = 0  # heartbeats failed in a row
        self.stopped = False  # the server refused our token: this node is done
        self.workloads: dict[str, SimulatedWorkload] = {}
        # MIG slices and shares: reported enforced, slices with deterministic MIG-<uuid>s
        self.parts = PartsManager(SimulatedEnforcer(hostname))

    def gpu_uuid(self, index: int) -> str:
        return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{self.hostname}/{index}')}"

    def registration(self, fabric: str, cpu_cores: int, memory_gib: int) -> dict:
        return {
            "hostname": self.hostname,
            "fabric": fabric,
            "gpu_model": self.gpu_model,
            "gpu_count": self.gpu_count,
            "cpu_cores": cpu_cores,
            "memory_gib": memory_gib,
            "os": "Ubuntu 22.04",
            "driver_version": "550.54.15",
            "gpus": [
                {
                    "index": index,
                    "uuid": self.gpu_uuid(index),
                    "memory_mib": self.memory_mib,
                    # one NVSwitch domain per HGX board, i.e. per host
                    "nvlink_domain": self.hostname[:80],  # the server keeps 80 characters
                }
                for index in range(self.gpu_count)
            ],
        }

    def sample(self, control: Control) -> list[GpuSample]:
        failed = control.fail_gpus.get(self.hostname, frozenset())
        degraded = control.degrade_gpus.get(self.hostname, frozenset())
        busy = self.leases.busy_gpus()
        return [self._sample_one(i, i in failed, i in degraded, i in busy) for i in range(self.gpu_count)]

    def _sample_one(self, index: int, failed: bool, degraded: bool, busy: bool) -> GpuSample:
        rnd = self.random
        if failed:
            return GpuSample(index, rnd.randint(30, 40), 0, 0, ecc_errors=1, xid_errors=XID_FELL_OFF_THE_BUS)
        if degraded:
            self.xid_counts[index] += 1
        else:
            self.xid_counts[index] = 0
        if busy:
            temperature = rnd.randint(60, 75)
            utilization = rnd.randint(90, 100)
            memory = int(self.memory_mib * rnd.uniform(0.60, 0.95))
        else:
            temperature, utilization, memory = rnd.randint(30, 40), 0, rnd.randint(0, 5)
        if degraded:
            temperature = rnd.randint(90, 95)
        return GpuSample(index, temperature, utilization, memory, 0, self.xid_counts[index])

    def ib_ports(self) -> list[dict]:
        """One NDR port per GPU rail, all active."""
        return [{"port": rail, "state": "active", "rate_gbps": 400} for rail in range(1, self.gpu_count + 1)]

    # pretended workloads

    def apply_workloads(self, actions: list[Action]) -> None:
        for action in actions:
            current = self.workloads.get(action.lease)
            if action.action == "start" and action.launch and action.launch.command is not None:
                if current is None or current.generation != action.launch.generation:
                    self.workloads[action.lease] = self._pretend(action.lease, action.gpus, action.launch)
            elif action.action in ("notice", "stop") and current and current.state == "running":
                current.end("stopped", SIGTERM_EXIT_CODE, "simulated: SIGTERM received; stopped")
            if action.action == "stop" and current and not current.lines:
                del self.workloads[action.lease]

    def _pretend(self, lease: str, gpus: list[int], launch: Launch) -> SimulatedWorkload:
        port = launch.master_port or (SIMULATED_MASTER_PORT if launch.node_rank == 0 else None)
        rails = [IbPort(f"mlx5_{rail}", 1, "active", 400) for rail in range(self.gpu_count)]
        account = f"ibex-l{lease}"
        env = launch_env(lease, launch, gpus, rails, self.gpu_count, account, f"/home/{account}",
                         self.hostname, port, self.parts.devices_for(lease))
        seconds = launch.env.get("IBEX_SIMULATED_SECONDS")
        try:
            ends_at = time.time() + float(seconds) if seconds else None
        except ValueError:
            ends_at = None
        return SimulatedWorkload(
            lease, launch.generation, _now(), ends_at,
            master_port=port if launch.node_rank == 0 else None,
            lines=[
                f"simulated: rank {launch.node_rank} of {launch.nnodes} on {self.hostname}, "
                f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}",
                f"simulated: command: {' '.join(launch.command or [])}",
                f"simulated: env: {' '.join(sorted(env))}",
            ],
        )

    def workload_reports(self) -> list[dict]:
        now = time.time()
        for workload in self.workloads.values():
            if workload.state == "running" and workload.ends_at is not None and now >= workload.ends_at:
                workload.end("exited", 0, "simulated: done, exit code 0")
        return [workload.report() for _, workload in sorted(self.workloads.items())]

    def logs_to_ship(self) -> list[tuple[SimulatedWorkload, dict]]:
        return [
            (w, {"lease": w.lease, "generation": w.generation, "from_line": w.next_line, "lines": list(w.lines)})
            for w in self.workloads.values() if w.lines
        ]

    def shipped(self, workload: SimulatedWorkload, count: int) -> None:
        del workload.lines[:count]
        workload.next_line += count
        if workload.state == "stopped" and workload.lease not in self.leases.serving and not workload.lines:
            self.workloads.pop(workload.lease, None)


def _now() -> str:
    return iso_utc(datetime.now(UTC)) or ""

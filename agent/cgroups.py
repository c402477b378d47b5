"""One cgroup per lease run, so every process the command starts can be found and killed,
even one that left its process group (setsid, a daemonising shell, nohup).

cgroup v2 (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts) is preferred: its
`cgroup.kill` kills the whole tree at once. Else a v1 `pids` or `freezer` hierarchy, whose
`cgroup.procs` we read and signal. Else None: the caller falls back to the process group.
"""

import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "ibex-agent"
NVIDIA_MAJOR = 195  # /dev/nvidia<minor>; the driver numbers minors in PCI order, as NVML indexes


def candidates(root: Path | None = None) -> list[Path]:
    root = root or CGROUP_ROOT
    v2 = [base for base in (root, root / "unified") if (base / "cgroup.controllers").exists()]
    v1 = [root / name for name in ("pids", "freezer") if (root / name / "cgroup.procs").exists()]
    return v2 + v1


def create(name: str, root: Path | None = None) -> Path | None:
    """A new (or left-over, reused) cgroup for `name` in the first writable hierarchy."""
    for base in candidates(root):
        path = base / PARENT / name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if (path / "cgroup.procs").exists():
            return path
    return None


def join(path: Path, pid: int) -> None:
    (path / "cgroup.procs").write_text(str(pid))


def pids(path: Path) -> list[int]:
    try:
        return [int(line) for line in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def signal_all(path: Path, signum: int) -> None:
    if signum == signal.SIGKILL and (path / "cgroup.kill").exists():
        try:
            (path / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
    for pid in pids(path):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_and_remove(path: Path, timeout_s: float = 5.0) -> bool:
    """SIGKILL everything in it, then rmdir it; False if processes outlived `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while pids(path):
        signal_all(path, signal.SIGKILL)  # again: a fork may have raced the first kill
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False  # e.g. a zombie not yet reaped; the next cleanup tries again
    return True


def fence_gpus(name: str, leased: list[int], gpus_on_node: int,
               root: Path | None = None) -> Path | None:
    """A v1 `devices` cgroup in which the node's other GPUs cannot be opened (their
    /dev/nvidia<index> denied), so a command ignoring CUDA_VISIBLE_DEVICES, or `nvidia-smi`,
    sees only the leased GPUs. None where no devices hierarchy is writable (cgroup v2 fences
    devices with eBPF programs, which the agent does not load): then CUDA_VISIBLE_DEVICES
    only steers."""
    base = (root or CGROUP_ROOT) / "devices"
    if not (base / "devices.deny").exists():
        return None
    path = base / PARENT / name
    try:
        path.mkdir(parents=True, exist_ok=True)
        for index in sorted(set(range(gpus_on_node)) - set(leased)):
            (path / "devices.deny").write_text(f"c {NVIDIA_MAJOR}:{index} rwm")
    except OSError:
        return None
    return path


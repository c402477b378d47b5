"""Finding and signalling processes through /proc: is a pid still our supervisor, which
processes does a lease account own, signal a process group."""

import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def is_supervisor(pid: int | None, spec_path: Path) -> bool:
    """True while `pid` runs `agent.supervise` for this spec: a recycled pid, or a zombie
    (whose cmdline is empty), is not ours."""
    if not pid:
        return False
    try:
        argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"agent.supervise" in argv and str(spec_path).encode() in argv


def pids_of_uid(uid: int) -> list[int]:
    """Live processes whose real or effective uid is `uid` (zombies are dead already, and in
    a container whose init does not reap they would never go away)."""
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = dict(
                line.split(":", 1) for line in (entry / "status").read_text().splitlines() if ":" in line
            )
            real, effective = (int(value) for value in fields["Uid"].split()[:2])
        except (OSError, ValueError, KeyError):
            continue
        if uid in (real, effective) and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry.name))
    return found


def kill_uid(uid: int, timeout_s: float = 5.0) -> bool:
    """SIGKILL every process of `uid` until none is left; False if some outlived `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while pids := pids_of_uid(uid):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def signal_group(pgid: int | None, signum: int) -> None:
    if not pgid:
        return
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int | None) -> bool:
    if not pgid:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

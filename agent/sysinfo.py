"""Facts about this machine for registration: hostname, CPU cores, memory, operating system."""

import os
import socket
from pathlib import Path


def hostname() -> str:
    return socket.gethostname()


def cpu_cores() -> int:
    return os.cpu_count() or 1


def memory_gib(meminfo: Path = Path("/proc/meminfo")) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20)  # the value is in KiB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def os_name(os_release: Path = Path("/etc/os-release")) -> str | None:
    """`Ubuntu 22.04` from /etc/os-release (NAME and VERSION_ID)."""
    try:
        fields = dict(
            line.split("=", 1) for line in os_release.read_text().splitlines() if "=" in line
        )
    except OSError:
        return None
    name = fields.get("NAME", "").strip('"')
    version = fields.get("VERSION_ID", "").strip('"')
    return f"{name} {version}".strip() or None

"""InfiniBand port states from sysfs: /sys/class/infiniband/<hca>/ports/<n>/{state,rate}.

The files read like `4: ACTIVE` and `400 Gb/sec (4X NDR)`. Ports whose link layer is
Ethernet (RoCE) are skipped: they are not part of the InfiniBand fabric.
"""

import re
from dataclasses import dataclass
from pathlib import Path

SYSFS_INFINIBAND = Path("/sys/class/infiniband")

_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


@dataclass(frozen=True)
class IbPort:
    device: str  # the HCA, e.g. mlx5_0
    port: int  # the port number on that HCA
    state: str  # down, init, armed, active, active_defer, unknown
    rate_gbps: float | int | None
    # the port's P_Key table as OpenSM programmed it (sysfs `pkeys/<index>`), full-member bit
    # included; NCCL names a partition by its index here (NCCL_IB_PKEY)
    pkeys: tuple[int, ...] = ()


def parse_state(text: str) -> str:
    """`4: ACTIVE` -> `active`; anything unreadable -> `unknown`."""
    _, _, name = text.strip().partition(":")
    name = name.strip().lower()
    return name or "unknown"


def parse_rate(text: str) -> float | int | None:
    """`400 Gb/sec (4X NDR)` -> 400; `2.5 Gb/sec (1X SDR)` -> 2.5; unreadable -> None."""
    match = _RATE.match(text)
    if not match:
        return None
    value = float(match.group(1))
    return int(value) if value.is_integer() else value


def read_ib_ports(root: Path = SYSFS_INFINIBAND) -> list[IbPort]:
    """Every InfiniBand port under `root`, sorted by HCA and port; [] if there is no sysfs tree."""
    ports: list[IbPort] = []
    if not root.is_dir():
        return ports
    for port_dir in sorted(root.glob("*/ports/*")):
        state_text = _read(port_dir / "state")
        if state_text is None or not port_dir.name.isdigit():
            continue
        if (_read(port_dir / "link_layer") or "InfiniBand").strip().lower() == "ethernet":
            continue
        rate_text = _read(port_dir / "rate")
        ports.append(
            IbPort(
                device=port_dir.parent.parent.name,
                port=int(port_dir.name),
                state=parse_state(state_text),
                rate_gbps=parse_rate(rate_text) if rate_text else None,
                pkeys=read_pkey_table(port_dir / "pkeys"),
            )
        )
    return sorted(ports, key=lambda p: (p.device, p.port))


def read_pkey_table(directory: Path) -> tuple[int, ...]:
    """The P_Key table, by index (files `0`, `1`, ... holding `0xffff`); empty entries are
    0x0000, and an unreadable table is empty."""
    if not directory.is_dir():
        return ()
    entries: dict[int, int] = {}
    for entry in directory.iterdir():
        text = _read(entry)
        if entry.name.isdigit() and text is not None:
            try:
                entries[int(entry.name)] = int(text.strip(), 16)
            except ValueError:
                continue
    return tuple(entries.get(i, 0) for i in range(max(entries, default=-1) + 1))


def pkey_index(ports: list[IbPort], pkey: int) -> int | None:
    """The index of `pkey` (15 bits; either membership) in the tables of every one of `ports`,
    if it is the same on all of them; None while OpenSM has not put it on one (the agent's
    next launch sees it) or where the ports disagree."""
    indexes = set()
    for port in ports:
        found = [i for i, value in enumerate(port.pkeys) if value & 0x7FFF == pkey]
        if not found:
            return None
        indexes.add(found[0])
    return indexes.pop() if len(indexes) == 1 else None


def ports_payload(ports: list[IbPort]) -> list[dict]:
    """The heartbeat's `ib_ports`: one entry per port, numbered 1..n across the node's HCAs.

    A node with eight single-port HCAs (one per GPU rail) has eight ports all numbered 1 in
    sysfs; numbering them in HCA order keeps `port` unique per node (port k = rail k).
    """
    payload = []
    for number, port in enumerate(ports, start=1):
        entry: dict = {"port": number, "state": port.state}
        if port.rate_gbps is not None:  # the server takes a number or nothing
            entry["rate_gbps"] = port.rate_gbps
        payload.append(entry)
    return payload


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None

"""Write a fabric as an ibsim net file, so that ``ibsim -s FILE`` simulates it.

The net file is ibnetdiscover's format, which ibsim reads: one record per node, its GUID on a
``switchguid=`` / ``caguid=`` line, its name (switch) or node description (HCA, ``node01
mlx5_0``) in quotes, then every cabled port with the far end and the link's width and speed.
The GUIDs are the fabric's own, so what ``ibnetdiscover`` reads back under ibsim matches the
fabric IBEX holds port for port.

ibsim knows the speeds up to EDR; a faster link (HDR, NDR, XDR) is simulated as EDR, and the
live view then reports it at the EDR rate.
"""

from __future__ import annotations

from fabric.core.spec import FabricSpec

# Lane speeds ibsim can simulate, fastest first: Gb/s per lane -> name.
SIM_SPEEDS = ((25.0, "EDR"), (14.0, "FDR"), (10.0, "QDR"), (5.0, "DDR"), (2.5, "SDR"))
MAX_SIM_NODES = 2048  # ibsim's limit, switches included
MAX_SIM_SWITCHES = 256


def _speed(rate_gbps: float | None, width: str | None) -> str:
    lanes = int((width or "4x").rstrip("x") or 4)
    per_lane = (rate_gbps or 100.0) / lanes
    for rate, name in SIM_SPEEDS:
        if per_lane >= rate:
            return f"{lanes}x{name}"
    return f"{lanes}xSDR"


def ibsim_netfile(spec: FabricSpec) -> str:
    switches = spec.switch_by_guid()
    hcas = {hca.guid: hca for hca in spec.hcas}
    if len(switches) + len(hcas) > MAX_SIM_NODES or len(switches) > MAX_SIM_SWITCHES:
        raise ValueError(f"{len(switches)} switches and {len(hcas)} HCAs: ibsim holds at most "
                         f"{MAX_SIM_NODES} nodes and {MAX_SIM_SWITCHES} switches")
    name = {guid: s.name for guid, s in switches.items()}
    name.update({guid: hca.description or f"{hca.host} mlx5_0" for guid, hca in hcas.items()})
    ports: dict[str, list[tuple[int, str, int, str]]] = {guid: [] for guid in name}
    for link in spec.links:
        speed = _speed(link.rate_gbps, link.width)
        ports[link.a_guid].append((link.a_port, link.b_guid, link.b_port, speed))
        ports[link.b_guid].append((link.b_port, link.a_guid, link.a_port, speed))
    lines = [f"# {len(switches)} switches, {len(hcas)} HCAs: written by IBEX for ibsim", ""]
    for guid in [*switches, *hcas]:
        is_switch = guid in switches
        count = max((number for number, *_ in ports[guid]), default=1)
        if is_switch:
            count = max(count, switches[guid].ports)
        lines.append(f"{'switchguid' if is_switch else 'caguid'}={guid}")
        lines.append(f'{"Switch" if is_switch else "Hca"}\t{count}\t"{name[guid]}"')
        for number, far, far_port, speed in sorted(ports[guid]):
            lines.append(f'[{number}]\t"{name[far]}"[{far_port}]\t# lid 0 {speed}')
        lines.append("")
    return "\n".join(lines)

"""Parse the text output of ``ibnetdiscover`` into a FabricSpec.

The format, one record per switch or channel adapter (CA)::

    vendid=0x2c9
    devid=0xd2f0
    sysimgguid=0x7cfe900300b2ea8e
    switchguid=0x7cfe900300b2ea8e(7cfe900300b2ea8e)
    Switch  36 "S-7cfe900300b2ea8e"  # "MF0;leaf01:MQM9700/U1" enhanced port 0 lid 1 lmc 0
    [1]  "H-b8599f0300e1b6a0"[1](b8599f0300e1b6a0)  # "node01 mlx5_0" lid 5 4xNDR

    caguid=0xb8599f0300e1b6a0
    Ca  1 "H-b8599f0300e1b6a0"  # "node01 mlx5_0"
    [1](b8599f0300e1b6a0)  "S-7cfe900300b2ea8e"[1]  # lid 5 lmc 0 "MF0;leaf01:MQM9700/U1" lid 1 4xNDR

A host is the first word of its CA's description; a CA still carrying the factory description
("MT4129 ConnectX7 Mellanox Technologies") names no host and is left out with its cables.
Each cable is listed from both ends; the two listings must agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabric.core.errors import FabricFormatError
from fabric.core.spec import (
    MAX_DESCRIPTION_LENGTH,
    MAX_NAME_LENGTH,
    MAX_PORTS,
    FabricSpec,
    HcaSpec,
    LinkSpec,
    SwitchSpec,
    normalise_guid,
)

# Gb/s per lane, as marketed (4xNDR = 400 Gb/s).
LANE_RATE_GBPS = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0,
    "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}
WIDTHS = {1, 2, 4, 8, 12}

_HEADER = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=\S+$")
_NODE = re.compile(
    r'^(?P<type>Switch|Ca|Rt)\s+(?P<ports>\d{1,3})\s+"(?P<prefix>[SHR])-(?P<guid>(?:0x)?[0-9a-fA-F]+)"'
    r'\s*(?:#\s*"(?P<desc>[^"]*)")?(?P<rest>.*)$'
)
_PORT = re.compile(
    r"^\[(?P<port>\d{1,3})\](?:\[ext \d+\])?(?:\((?P<portguid>[0-9a-fA-F]+)\))?\s+"
    r'"(?P<rprefix>[SHR])-(?P<rguid>(?:0x)?[0-9a-fA-F]+)"\[(?P<rport>\d{1,3})\](?:\[ext \d+\])?'
    r"(?:\([0-9a-fA-F]+\))?\s*(?:#(?P<comment>.*))?$"
)
_RATE = re.compile(r"\b(\d{1,2})x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")
_DEFAULT_CA = re.compile(r"^(MT\d+\b|.*Mellanox Technologies|.*NVIDIA Technologies)", re.I)
_SWITCH_NAME_UNSAFE = re.compile(r"[\s\[\],=#\"]")


@dataclass
class _Node:
    type: str  # "Switch" | "Ca"
    guid: str
    ports: int
    description: str
    line: int


@dataclass
class _Cable:
    a: tuple[str, int]
    b: tuple[str, int]
    rate_gbps: float | None
    width: str | None
    line: int


@dataclass
class _State:
    path: str
    nodes: dict[str, _Node] = field(default_factory=dict)
    peer: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    listed: dict[tuple[str, int], int] = field(default_factory=dict)  # end -> line it was listed
    cables: list[_Cable] = field(default_factory=list)

    def fail(self, line: int, message: str) -> None:
        raise FabricFormatError(self.path, line, message)


def _rate(comment: str) -> tuple[float | None, str | None]:
    found = _RATE.findall(comment)
    if not found:
        return None, None
    width, speed = found[-1]
    if int(width) not in WIDTHS:
        return None, None
    return int(width) * LANE_RATE_GBPS[speed], f"{width}x"


def _guid(state: _State, text: str, line: int) -> str:
    guid = normalise_guid(text)
    if len(guid) > 18:
        state.fail(line, f"GUID {text[:24]!r}... is longer than 64 bits")
    return guid


def _read_node(state: _State, match: re.Match, line: int) -> _Node:
    if match["type"] == "Rt":
        state.fail(line, "router (Rt) records are not supported")
    if not 1 <= int(match["ports"]) <= MAX_PORTS:
        state.fail(line, f"a node has 1 to {MAX_PORTS} ports, not {match['ports']}")
    guid = _guid(state, match["guid"], line)
    if guid in state.nodes:
        state.fail(line, f"duplicate GUID {guid} (first on line {state.nodes[guid].line})")
    node = _Node(match["type"], guid, int(match["ports"]), match["desc"] or "", line)
    state.nodes[guid] = node
    return node


def _read_port(state: _State, node: _Node, match: re.Match, line: int) -> None:
    port, rport = int(match["port"]), int(match["rport"])
    remote_guid = _guid(state, match["rguid"], line)
    if port < 1 or port > node.ports:
        state.fail(line, f"port {port} outside the {node.ports} ports of {node.guid}")
    if remote_guid == node.guid:
        state.fail(line, f"self link: port {port} of {node.guid} is cabled to its own port {rport}")
    here, there = (node.guid, port), (remote_guid, rport)
    if here in state.listed:
        state.fail(line, f"port {port} of {node.guid} is on two links "
                         f"(also line {state.listed[here]})")
    state.listed[here] = line
    known_peer = state.peer.get(here)
    if known_peer is not None and known_peer != there:
        state.fail(line, f"port {port} of {node.guid} is on two links")
    remote_peer = state.peer.get(there)
    if remote_peer is not None and remote_peer != here:
        state.fail(line, f"port {rport} of {remote_guid} is on two links")
    if known_peer is None:  # first time this cable is seen
        state.peer[here], state.peer[there] = there, here
        rate, width = _rate(match["comment"] or "")
        state.cables.append(_Cable(here, there, rate, width, line))


def _scan(text: str, path: str) -> _State:
    state = _State(path)
    current: _Node | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.strip()
        if not content or content.startswith("#"):
            continue
        if _HEADER.match(content):
            current = None  # a new record's header starts
            continue
        node = _NODE.match(content)
        if node:
            current = _read_node(state, node, number)
            continue
        port = _PORT.match(content)
        if port:
            if current is None:
                state.fail(number, "port line outside a Switch or Ca record")
            _read_port(state, current, port, number)
            continue
        state.fail(number, f"malformed line: {content[:60]!r}")
    return state


def host_of_description(description: str) -> str | None:
    """``"node01 mlx5_0"`` -> ``"node01"``; a factory description names no host."""
    words = description.split()
    if not words or _DEFAULT_CA.match(description.strip()):
        return None
    return words[0]


def _switch_names(switches: list[_Node]) -> dict[str, str]:
    """``MF0;leaf01:MQM9700/U1`` -> ``leaf01``; a missing, unsafe or shared name falls back to
    ``S-<guid>`` so that names stay unique and usable in topology.conf."""
    wanted = {}
    for switch in switches:
        text = switch.description
        if ";" in text:
            text = text.split(";", 1)[1].split(":", 1)[0]
        wanted[switch.guid] = text.strip()
    counts: dict[str, int] = {}
    for name in wanted.values():
        counts[name] = counts.get(name, 0) + 1
    names = {}
    for guid, name in wanted.items():
        unusable = (not name or _SWITCH_NAME_UNSAFE.search(name) or counts[name] > 1
                    or len(name) > MAX_NAME_LENGTH)
        names[guid] = f"S-{guid[2:]}" if unusable else name
    return names


def parse_ibnetdiscover(
    text: str, path: str = "ibnetdiscover.txt", gpus_per_node: int | dict[str, int] = 8
) -> FabricSpec:
    state = _scan(text, path)
    for cable in state.cables:
        for guid, port in (cable.a, cable.b):
            if guid not in state.nodes:
                state.fail(cable.line, f"link to an unknown node {guid}")
            if not 1 <= port <= state.nodes[guid].ports:
                state.fail(cable.line, f"port {port} outside the {state.nodes[guid].ports} "
                                       f"ports of {guid}")
    hosts = {
        guid: host_of_description(node.description)
        for guid, node in state.nodes.items()
        if node.type == "Ca"
    }
    switch_nodes = [n for n in state.nodes.values() if n.type == "Switch"]
    names = _switch_names(switch_nodes)
    switches = tuple(
        SwitchSpec(n.guid, names[n.guid], None, n.ports, line=n.line) for n in switch_nodes
    )
    hcas: list[HcaSpec] = []
    links: list[LinkSpec] = []
    for cable in state.cables:
        a, b = cable.a, cable.b
        if a[0] in hosts and b[0] in hosts:
            state.fail(cable.line, "a CA cabled straight to a CA has no switch")
        if b[0] in hosts or (a[0] not in hosts and b < a):
            a, b = b, a  # the HCA end (else the lower GUID) comes first
        if a[0] in hosts:
            host = hosts[a[0]]
            if host is None:
                continue  # factory description: the CA and its cable are left out
            node = state.nodes[a[0]]
            if len(host) > MAX_NAME_LENGTH or len(node.description) > MAX_DESCRIPTION_LENGTH:
                state.fail(node.line, f"CA description {node.description[:20]!r}... names a host "
                           f"longer than {MAX_NAME_LENGTH} characters or is longer than "
                           f"{MAX_DESCRIPTION_LENGTH}")
            hcas.append(HcaSpec(a[0], host, a[1], node.description, line=node.line))
        links.append(LinkSpec(a[0], a[1], b[0], b[1], cable.rate_gbps, cable.width,
                              line=cable.line))
    if not hcas:
        state.fail(1, "no CA names a host")
    per_host: dict[str, set[str]] = {}
    for link in links:
        if link.a_guid in hosts:
            per_host.setdefault(hosts[link.a_guid], set()).add(link.b_guid)
    kind = "rail-optimised" if any(len(s) > 1 for s in per_host.values()) else "fat-tree"
    return FabricSpec(kind, switches, tuple(hcas), tuple(links), gpus_per_node, source=path)

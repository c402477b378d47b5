"""Read the live fabric from the text of infiniband-diags: ``ibnetdiscover`` and ``perfquery``.

The importer (`fabric.core.ibnetdiscover`) turns a saved ``ibnetdiscover`` file into a
FabricSpec to build a fabric from; this module reads the same output as the fabric agent sees it
each interval: every node with its LID, every cable that is up with its rate, and the port
counters of ``perfquery``. Plain text in, plain data out, so that the agent (which imports no
Django) and the tests share it.

A cable is listed by ``ibnetdiscover`` from both of its ends when both nodes are reached; a node
reached only through one end (its other cables down) still lists the cable from the far side.
Each cable is kept once, its ends in a canonical order (see `LiveLink.key`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from fabric.core.spec import normalise_guid

# Gb/s per lane, as marketed (4xEDR = 100 Gb/s); the importer's table.
LANE_RATE_GBPS = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0,
    "EDR": 25.0, "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}

_HEADER = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=\S+$")
_NODE = re.compile(
    r'^(?P<type>Switch|Ca|Rt)\s+(?P<ports>\d{1,3})\s+"[SHR]-(?P<guid>(?:0x)?[0-9a-fA-F]+)"'
    r'\s*(?:#\s*"(?P<desc>[^"]*)")?(?P<rest>.*)$'
)
_PORT = re.compile(
    r"^\[(?P<port>\d{1,3})\](?:\[ext \d+\])?(?:\((?P<portguid>[0-9a-fA-F]+)\))?\s+"
    r'"[SHR]-(?P<rguid>(?:0x)?[0-9a-fA-F]+)"\[(?P<rport>\d{1,3})\](?:\[ext \d+\])?'
    r"(?:\([0-9a-fA-F]+\))?\s*(?:#(?P<comment>.*))?$"
)
_LID = re.compile(r"\blid (\d+)\b")
_RATE = re.compile(r"\b(\d{1,2})x(SDR|DDR|QDR|FDR10|FDR|EDR|HDR|NDR|XDR)\b")

# perfquery's names -> the report's. Data counters count 4-byte words (octets / 4).
COUNTERS = {
    "PortXmitData": "xmit_data",
    "PortRcvData": "rcv_data",
    "SymbolErrorCounter": "symbol_errors",
    "LinkDownedCounter": "link_downed",
    "PortRcvErrors": "rcv_errors",
    "PortXmitDiscards": "xmit_discards",
}
COUNTER_FIELDS = tuple(COUNTERS.values())
_BLOCK = re.compile(r"^# Port (?P<ext>extended )?counters: Lid (?P<lid>\d+) port (?P<port>\d+)")
_FIELD = re.compile(r"^(?P<name>\w+):\.*(?P<value>\S+)$")


class DiagsFormatError(ValueError):
    """Output of a diagnostic that this module cannot read."""


@dataclass(frozen=True)
class LiveNode:
    guid: str  # 0x + 16 hex digits, as the importer stores it
    kind: str  # "switch" | "ca" | "router"
    ports: int
    description: str
    lid: int  # the switch's (port 0) LID, or the CA's first cabled port's; 0 before an SM ran


@dataclass(frozen=True)
class LiveLink:
    a_guid: str
    a_port: int
    b_guid: str
    b_port: int
    rate_gbps: float | None
    width: str | None  # "4x"

    @property
    def key(self) -> tuple[tuple[str, int], tuple[str, int]]:
        return link_key(self.a_guid, self.a_port, self.b_guid, self.b_port)


def link_key(a_guid: str, a_port: int, b_guid: str, b_port: int):
    """A cable's identity whichever end it is read from: its two ends, the lower one first."""
    return tuple(sorted(((a_guid, a_port), (b_guid, b_port))))


@dataclass(frozen=True)
class Discovery:
    nodes: dict[str, LiveNode]
    links: list[LiveLink]
    port_guids: dict[str, str] = field(default_factory=dict)  # a CA port's GUID -> its node's
    # (a CA's node GUID, port number) -> that port's GUID: what OpenSM's partition lines name
    ca_ports: dict[tuple[str, int], str] = field(default_factory=dict)

    def cabled_ports(self) -> dict[str, list[int]]:
        """Each node's ports that have a cable up, in order."""
        ports: dict[str, set[int]] = {}
        for link in self.links:
            ports.setdefault(link.a_guid, set()).add(link.a_port)
            ports.setdefault(link.b_guid, set()).add(link.b_port)
        return {guid: sorted(numbers) for guid, numbers in ports.items()}


def _rate(comment: str) -> tuple[float | None, str | None]:
    found = _RATE.findall(comment)
    if not found:
        return None, None
    width, speed = found[-1]
    return int(width) * LANE_RATE_GBPS[speed], f"{width}x"


def parse_discovery(text: str) -> Discovery:
    """Nodes and cables of one ``ibnetdiscover`` run."""
    nodes: dict[str, LiveNode] = {}
    links: dict[tuple, LiveLink] = {}
    port_guids: dict[str, str] = {}
    ca_ports: dict[tuple[str, int], str] = {}
    current: dict | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#") or _HEADER.match(line):
            continue
        node = _NODE.match(line)
        if node:
            kind = {"Switch": "switch", "Ca": "ca", "Rt": "router"}[node["type"]]
            lid = _LID.search(node["rest"] or "")
            current = {"guid": normalise_guid(node["guid"]), "kind": kind,
                       "ports": int(node["ports"]), "description": node["desc"] or "",
                       "lid": int(lid.group(1)) if lid and kind == "switch" else 0}
            nodes[current["guid"]] = LiveNode(**current)
            continue
        port = _PORT.match(line)
        if not port:
            raise DiagsFormatError(f"ibnetdiscover line {number}: cannot read {line[:80]!r}")
        if current is None:
            raise DiagsFormatError(f"ibnetdiscover line {number}: a port outside a node")
        comment = port["comment"] or ""
        if current["kind"] == "ca" and port["portguid"]:
            port_guids[normalise_guid(port["portguid"])] = current["guid"]
            ca_ports[(current["guid"], int(port["port"]))] = normalise_guid(port["portguid"])
        if current["kind"] == "ca" and not current["lid"]:
            # a CA's port line starts its comment with its own LID: `# lid 4 lmc 0 "leaf1" ...`
            lid = _LID.search(comment)
            if lid:
                current["lid"] = int(lid.group(1))
                nodes[current["guid"]] = LiveNode(**current)
        rate, width = _rate(comment)
        here = (current["guid"], int(port["port"]))
        there = (normalise_guid(port["rguid"]), int(port["rport"]))
        (a_guid, a_port), (b_guid, b_port) = link_key(*here, *there)
        link = LiveLink(a_guid, a_port, b_guid, b_port, rate, width)
        links.setdefault(link.key, link)
    return Discovery(nodes=nodes, links=sorted(links.values(), key=lambda item: item.key),
                     port_guids=port_guids, ca_ports=ca_ports)


def parse_perfquery(text: str) -> dict[tuple[int, int], dict]:
    """``perfquery [-x] LID PORTS`` -> {(lid, port): {counter: value, "extended": bool}}.

    Only the counters of `COUNTERS` are kept; an extended block (``-x``) says so, because its
    data counters are 64-bit where the basic ones are 32-bit and stop at their maximum.
    """
    samples: dict[tuple[int, int], dict] = {}
    current: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        block = _BLOCK.match(line)
        if block:
            current = samples.setdefault((int(block["lid"]), int(block["port"])), {})
            current["extended"] = bool(block["ext"])
            continue
        field = _FIELD.match(line)
        if field and current is not None and field["name"] in COUNTERS:
            try:
                current[COUNTERS[field["name"]]] = int(field["value"], 0)
            except ValueError:
                raise DiagsFormatError(f"perfquery: {field['name']} is not a number: "
                                       f"{field['value'][:40]!r}") from None
    return samples


def merge_counters(basic: dict, extended: dict | None) -> dict:
    """One port's counters: the error counters from the basic block, the data counters from the
    extended block where there is one (64-bit, never saturated)."""
    merged = {name: basic.get(name, 0) for name in COUNTER_FIELDS}
    merged["extended"] = False
    if extended:
        for name in ("xmit_data", "rcv_data"):
            if name in extended:
                merged[name] = extended[name]
        merged["extended"] = True
    return merged


_QE_PORT = re.compile(r"^GUID (?P<guid>0x[0-9a-fA-F]+) port (?P<port>\d+|ALL):(?P<items>.*)$")
_QE_ITEM = re.compile(r"\[(?P<name>\w+) == (?P<value>\d+)")


def parse_ibqueryerrors(text: str, port_guids: dict[str, str]) -> dict[tuple[str, int], dict]:
    """``ibqueryerrors --counters`` (every port's data counters, extended where the port has
    them) or ``ibqueryerrors --threshold-file ZEROS`` (every port with a non-zero error counter)
    -> {(node GUID, port): {counter: value}}.

    The port lines name a switch by its node GUID and a CA by its node GUID (data) or its port
    GUID (errors): `port_guids` (from the discovery) turns a CA port's GUID into its node's.
    Output without ibqueryerrors' closing summary is refused: the run did not finish.
    """
    if "## Summary:" not in text:
        raise DiagsFormatError("ibqueryerrors: no summary (the run did not finish)")
    samples: dict[tuple[str, int], dict] = {}
    for raw in text.splitlines():
        line = _QE_PORT.match(raw.strip())
        if not line or line["port"] == "ALL":
            continue
        guid = normalise_guid(line["guid"])
        values = samples.setdefault((port_guids.get(guid, guid), int(line["port"])), {})
        for item in _QE_ITEM.finditer(line["items"]):
            if item["name"] in COUNTERS:
                values[COUNTERS[item["name"]]] = int(item["value"])
    return samples


# iblinkinfo's port states -> IBEX's link states (fabric.models.Link.State)
PORT_STATES = {"Active": "active", "Initialize": "init", "Armed": "armed", "Down": "down"}
_STATE_RANK = {"down": 0, "polling": 1, "init": 2, "armed": 3, "active": 4}
_LINKINFO = re.compile(
    r'^(?P<guid>0x[0-9a-fA-F]+)\s+"[^"]*"\s+\d+\s+(?P<port>\d+)\[[^\]]*\]\s+==\(.*?'
    r"(?P<state>Active|Initialize|Armed|Down)/\s*(?P<phys>\w+)\)==>"
)


def parse_linkinfo(text: str, port_guids: dict[str, str]) -> dict[tuple[str, int], str]:
    """``iblinkinfo --load-cache FILE -l`` (one line per port, read from ibnetdiscover's cache
    without a MAD sent) -> {(node GUID, port): link state}. A CA's port is named by its port
    GUID there; `port_guids` turns it into its node's."""
    states: dict[tuple[str, int], str] = {}
    for raw in text.splitlines():
        line = _LINKINFO.match(raw.strip())
        if line:
            guid = normalise_guid(line["guid"])
            states[(port_guids.get(guid, guid), int(line["port"]))] = PORT_STATES[line["state"]]
    return states


def link_state(states: dict[tuple[str, int], str], link: LiveLink) -> str:
    """A cable is as up as its less-up end (`init` while the subnet manager has not yet made
    both ends active); an end iblinkinfo did not list counts as active (ibnetdiscover crossed
    the cable, so it is physically up)."""
    ends = [states.get((link.a_guid, link.a_port), "active"),
            states.get((link.b_guid, link.b_port), "active")]
    return min(ends, key=_STATE_RANK.__getitem__)


_FTS_SWITCH = re.compile(r"^Unicast lids \[[^\]]*\] of switch .*\bguid (0x[0-9a-fA-F]+)")
_FTS_ENTRY = re.compile(r"^0x([0-9a-fA-F]{1,4}) (\d{1,3})\b")


def parse_dump_fts(text: str) -> dict[str, dict[int, int]]:
    """Every switch's unicast forwarding table from one ``dump_fts`` (or ``ibroute``) run:
    switch GUID -> {destination LID: out port}. A block per switch, headed ``Unicast lids
    [0x0-0x18] of switch ... guid 0x...  (leaf04):``, then ``0x0002 004 ...`` per LID routed
    (the LID, the out port; port 0 is the switch itself). A LID it does not list has no route."""
    tables: dict[str, dict[int, int]] = {}
    current: dict[int, int] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        header = _FTS_SWITCH.match(line)
        if header:
            current = tables.setdefault(normalise_guid(header.group(1)), {})
            continue
        entry = _FTS_ENTRY.match(line)
        if entry and current is not None:
            current[int(entry.group(1), 16)] = int(entry.group(2))
    if not tables and text.strip():
        raise DiagsFormatError("dump_fts printed no forwarding table")
    return tables

"""Slurm ``topology.conf``: parse (tree and block plugins) into a FabricSpec, and export domains.

Tree records:  ``SwitchName=s0 Nodes=tux[0-3] LinkSpeed=400`` / ``SwitchName=s9 Switches=s[0-2]``
Block records: ``BlockName=b1 Nodes=node[01-18]`` and one ``BlockSizes=18,36``.
Keys are case-insensitive and ``#`` starts a comment, as in Slurm. A bad file is rejected whole
with ``PATH:LINE: what is wrong``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from fabric.core.errors import FabricFormatError, HostlistError
from fabric.core.hostlist import compress_hostlist, expand_hostlist, natural_key, natural_sorted
from fabric.core.levels import NodeDomains, compute_domains, group_name
from fabric.core.spec import (
    MAX_NAME_LENGTH,
    FabricSpec,
    HcaSpec,
    LinkSpec,
    SwitchSpec,
    synthetic_guid,
)

_KEYS = {k.lower(): k for k in ("SwitchName", "Switches", "Nodes", "LinkSpeed", "BlockName",
                                 "BlockSizes")}
_ALLOWED = {
    "SwitchName": {"SwitchName", "Switches", "Nodes", "LinkSpeed"},
    "BlockName": {"BlockName", "Nodes"},
    "BlockSizes": {"BlockSizes"},
}
_BAD_NAME_CHARS = set("[],=#")
# What the database's link rate column (7 digits, one after the point) holds, in Gb/s.
MIN_LINK_SPEED, MAX_LINK_SPEED = 0.1, 100_000.0


@dataclass
class _Record:
    kind: str  # "SwitchName" | "BlockName" | "BlockSizes"
    line: int
    fields: dict[str, str]


@dataclass
class _SpecBuilder:
    """Lays out synthetic GUIDs and port numbers for a file that names no GUIDs."""

    switches: list[SwitchSpec] = field(default_factory=list)
    hcas: list[HcaSpec] = field(default_factory=list)
    links: list[LinkSpec] = field(default_factory=list)
    next_port: dict[str, int] = field(default_factory=dict)
    hca_count: Counter = field(default_factory=Counter)
    guid_of: dict[str, str] = field(default_factory=dict)

    def switch(self, name: str, line: int, tier: str | None = None) -> str:
        guid = synthetic_guid("switch", name)
        self.guid_of[name] = guid
        self.next_port[guid] = 1
        self.switches.append(SwitchSpec(guid, name, tier, 0, line=line))
        return guid

    def _port(self, guid: str) -> int:
        self.next_port[guid] += 1
        return self.next_port[guid] - 1

    def host(self, host: str, switch_guid: str, rate: float | None, line: int) -> None:
        # A host under two switches gets one HCA per cable, numbered in file order.
        index = self.hca_count[host]
        self.hca_count[host] += 1
        guid = synthetic_guid("hca", f"{host}/{index}")
        self.hcas.append(HcaSpec(guid, host, 1, host, line=line))
        self.links.append(LinkSpec(guid, 1, switch_guid, self._port(switch_guid), rate, line=line))

    def uplink(self, child: str, parent: str, rate: float | None, line: int) -> None:
        self.links.append(
            LinkSpec(child, self._port(child), parent, self._port(parent), rate, line=line)
        )

    def spec(self, gpus_per_node, path: str) -> FabricSpec:
        switches = tuple(
            SwitchSpec(s.guid, s.name, s.tier, self.next_port[s.guid] - 1, line=s.line)
            for s in self.switches
        )
        guids = Counter(s.guid for s in switches) + Counter(h.guid for h in self.hcas)
        clash = next((g for g, n in guids.items() if n > 1), None)
        if clash is not None:  # a 64-bit hash collision: astronomically unlikely, still checked
            raise FabricFormatError(path, 1, f"synthetic GUID {clash} collides")
        return FabricSpec("fat-tree", switches, tuple(self.hcas), tuple(self.links),
                          gpus_per_node, source=path)


def _logical_lines(text: str):
    """(line number, content) without comments; a trailing backslash continues a line."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].rstrip()
        if not pending:
            start = number
        if content.endswith("\\"):
            pending += content[:-1] + " "
            continue
        content = (pending + content).strip()
        pending = ""
        if content:
            yield start, content
    if pending.strip():
        yield start, pending.strip()


def _read_records(text: str, path: str) -> list[_Record]:
    records = []
    for line, content in _logical_lines(text):
        fields: dict[str, str] = {}
        for token in content.split():
            key, equals, value = token.partition("=")
            canonical = _KEYS.get(key.lower())
            if not equals or not key:
                raise FabricFormatError(path, line, f"malformed line: expected KEY=VALUE, got {token!r}")
            if canonical is None:
                raise FabricFormatError(path, line, f"unknown key {key!r}")
            if canonical in fields:
                raise FabricFormatError(path, line, f"{canonical} given twice")
            if not value:
                raise FabricFormatError(path, line, f"{canonical} has no value")
            fields[canonical] = value
        kind = next(iter(fields))
        if kind not in _ALLOWED:
            raise FabricFormatError(
                path, line, f"a line must start with SwitchName=, BlockName= or BlockSizes=, not {kind}="
            )
        extra = set(fields) - _ALLOWED[kind]
        if extra:
            raise FabricFormatError(path, line, f"{min(extra)}= is not allowed on a {kind} line")
        records.append(_Record(kind, line, fields))
    return records


def _hostlist(value: str, path: str, line: int) -> list[str]:
    try:
        names = expand_hostlist(value)
    except HostlistError as error:
        raise FabricFormatError(path, line, f"malformed hostlist: {error}") from None
    seen = set()
    for name in names:
        if name in seen:
            raise FabricFormatError(path, line, f"{name!r} listed twice")
        seen.add(name)
    return names


def _name(value: str, what: str, path: str, line: int) -> str:
    if _BAD_NAME_CHARS & set(value):
        raise FabricFormatError(path, line, f"malformed {what} name {value!r}")
    if len(value) > MAX_NAME_LENGTH:
        raise FabricFormatError(
            path, line, f"{what} name {value[:20]!r}... is longer than {MAX_NAME_LENGTH} characters")
    return value


def _link_speed(value: str | None, path: str, line: int) -> float | None:
    if value is None:
        return None
    try:
        speed = float(value)
    except ValueError:
        speed = -1.0
    if not MIN_LINK_SPEED <= speed <= MAX_LINK_SPEED:  # also refuses nan and inf
        raise FabricFormatError(
            path, line, f"LinkSpeed must be a number from {MIN_LINK_SPEED:g} to "
                        f"{MAX_LINK_SPEED:g} (Gb/s), not {value!r}")
    return speed


def parse_slurm_topology(
    text: str, path: str = "topology.conf", gpus_per_node: int | Mapping[str, int] = 8
) -> FabricSpec:
    """Read a tree or block ``topology.conf``; LinkSpeed is taken as Gb/s."""
    records = _read_records(text, path)
    kinds = {r.kind for r in records}
    if not records:
        raise FabricFormatError(path, 1, "no SwitchName or BlockName records")
    if "SwitchName" in kinds and kinds & {"BlockName", "BlockSizes"}:
        first_block = next(r for r in records if r.kind != "SwitchName")
        raise FabricFormatError(path, first_block.line, "mixes tree (SwitchName) and block records")
    if "SwitchName" in kinds:
        return _parse_tree(records, path, gpus_per_node)
    return _parse_block(records, path, gpus_per_node)


def _parse_tree(records: list[_Record], path: str, gpus_per_node) -> FabricSpec:
    first_line: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    for record in records:
        name = _name(record.fields["SwitchName"], "switch", path, record.line)
        if name in first_line:
            raise FabricFormatError(
                path, record.line, f"duplicate switch {name!r} (first on line {first_line[name]})"
            )
        first_line[name] = record.line
    for record in records:
        name = record.fields["SwitchName"]
        listed = _hostlist(record.fields.get("Switches", ""), path, record.line)
        for child in listed:
            if child not in first_line:
                raise FabricFormatError(path, record.line, f"switch {name!r} lists unknown switch {child!r}")
        children[name] = listed
    _reject_cycles(records, children, first_line, path)
    builder = _SpecBuilder()
    for record in records:
        builder.switch(record.fields["SwitchName"], record.line)
    for record in records:
        name = record.fields["SwitchName"]
        guid = builder.guid_of[name]
        rate = _link_speed(record.fields.get("LinkSpeed"), path, record.line)
        for host in _hostlist(record.fields.get("Nodes", ""), path, record.line):
            builder.host(_name(host, "node", path, record.line), guid, rate, record.line)
        for child in children[name]:
            builder.uplink(builder.guid_of[child], guid, rate, record.line)
    if not builder.hcas:
        raise FabricFormatError(path, records[0].line, "no Nodes= in any switch")
    return builder.spec(gpus_per_node, path)


def _reject_cycles(records, children, first_line, path) -> None:
    """Depth-first search in file order; a switch met again on its own path closes a cycle."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after
    for record in records:
        root = record.fields["SwitchName"]
        if root in state:
            continue
        path_stack = [root]
        iterators = [iter(children[root])]
        state[root] = "open"
        while iterators:
            child = next(iterators[-1], None)
            if child is None:
                state[path_stack.pop()] = "done"
                iterators.pop()
                continue
            if state.get(child) == "open":
                cycle = path_stack[path_stack.index(child):] + [child]
                parent = path_stack[-1]
                raise FabricFormatError(
                    path, first_line[parent], "cycle in the switch tree: " + " -> ".join(cycle)
                )
            if child not in state:
                state[child] = "open"
                path_stack.append(child)
                iterators.append(iter(children[child]))


def _parse_block_sizes(record: _Record, path: str) -> list[int]:
    try:
        sizes = [int(v) for v in record.fields["BlockSizes"].split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise FabricFormatError(path, record.line, "BlockSizes must be positive integers")
    for smaller, larger in zip(sizes, sizes[1:], strict=False):
        ratio = larger // smaller
        if larger % smaller or ratio < 2 or ratio & (ratio - 1):
            raise FabricFormatError(
                path, record.line, "each BlockSizes value must be a power-of-two multiple (>1) "
                f"of the previous one, not {smaller} then {larger}"
            )
    return sizes


def _parse_block(records: list[_Record], path: str, gpus_per_node) -> FabricSpec:
    """Blocks become leaf domains; the second BlockSizes value groups consecutive blocks into
    spine domains, the way Slurm aggregates blocks in file order."""
    sizes: list[int] | None = None
    blocks: list[tuple[str, list[str], int]] = []
    block_line: dict[str, int] = {}
    node_block: dict[str, str] = {}
    for record in records:
        if record.kind == "BlockSizes":
            if sizes is not None:
                raise FabricFormatError(path, record.line, "BlockSizes given twice")
            sizes = _parse_block_sizes(record, path)
            continue
        name = _name(record.fields["BlockName"], "block", path, record.line)
        if name in block_line:
            raise FabricFormatError(
                path, record.line, f"duplicate block {name!r} (first on line {block_line[name]})"
            )
        block_line[name] = record.line
        nodes = _hostlist(record.fields.get("Nodes", ""), path, record.line)
        if not nodes:
            raise FabricFormatError(path, record.line, f"block {name!r} has no Nodes=")
        for node in nodes:
            _name(node, "node", path, record.line)
            if node in node_block:
                raise FabricFormatError(path, record.line, f"node {node!r} is already in block {node_block[node]!r}")
            node_block[node] = name
        blocks.append((name, nodes, record.line))
    if not blocks:
        raise FabricFormatError(path, records[0].line, "BlockSizes without any BlockName")
    per_spine = sizes[1] // sizes[0] if sizes and len(sizes) > 1 else 1
    builder = _SpecBuilder()
    for start in range(0, len(blocks), per_spine):
        chunk = blocks[start : start + per_spine]
        spine = None
        if per_spine > 1:
            spine = builder.switch(group_name(b[0] for b in chunk), chunk[0][2], tier="spine")
        for name, nodes, line in chunk:
            leaf = builder.switch(name, line, tier="leaf")
            for node in nodes:
                builder.host(node, leaf, None, line)
            if spine is not None:
                builder.uplink(leaf, spine, None, line)
    return builder.spec(gpus_per_node, path)


# --- export -------------------------------------------------------------------------------


def _domains_of(source: FabricSpec | Mapping[str, NodeDomains]) -> Mapping[str, NodeDomains]:
    return compute_domains(source) if isinstance(source, FabricSpec) else source


def _group(domains: Mapping[str, NodeDomains]):
    """spine -> leaf -> hosts, all naturally ordered."""
    tree: dict[str, dict[str, list[str]]] = {}
    for host in natural_sorted(domains):
        d = domains[host]
        tree.setdefault(d.spine, {}).setdefault(d.leaf, []).append(host)
    return {s: dict(sorted(tree[s].items(), key=lambda kv: natural_key(kv[0])))
            for s in natural_sorted(tree)}


def _common_rate(source) -> float | None:
    if not isinstance(source, FabricSpec):
        return None
    rates = Counter(link.rate_gbps for link in source.links if link.rate_gbps is not None)
    return rates.most_common(1)[0][0] if rates else None


def _speed(rate: float | None) -> str:
    return "" if rate is None else f" LinkSpeed={rate:g}"


def export_slurm_tree(
    source: FabricSpec | Mapping[str, NodeDomains],
    top_name: str = "fabric",
    link_speed: float | None = None,
) -> str:
    """One logical switch per leaf domain, one per spine domain, and a top switch joining the
    spine switches (left out when there is only one). Importing the text gives the same domains.
    """
    domains = _domains_of(source)
    speed = _speed(link_speed if link_speed is not None else _common_rate(source))
    tree = _group(domains)
    lines = ["# topology.conf (topology/tree) written by IBEX"]
    used = {leaf for leaves in tree.values() for leaf in leaves} | set(tree)
    spine_switches = []
    for spine, leaves in tree.items():
        for leaf, hosts in leaves.items():
            lines.append(f"SwitchName={leaf} Nodes={compress_hostlist(hosts)}{speed}")
        if list(leaves) == [spine]:
            # A leaf with nothing above it is its own spine domain; hanging it under the top
            # switch would make the top its spine on re-import.
            continue
        name = spine if spine not in leaves else f"{spine}-group"
        lines.append(f"SwitchName={name} Switches={compress_hostlist(leaves)}{speed}")
        spine_switches.append(name)
    if len(spine_switches) > 1:
        while top_name in used:
            top_name += "-top"
        lines.append(f"SwitchName={top_name} Switches={compress_hostlist(spine_switches)}{speed}")
    return "\n".join(lines) + "\n"


def export_slurm_block(
    source: FabricSpec | Mapping[str, NodeDomains], block_sizes: list[int] | None = None
) -> str:
    """One block per leaf domain, blocks of one spine domain written consecutively.

    BlockSizes defaults to the largest leaf domain, plus the spine size when every spine domain
    holds the same power-of-two number (>1) of leaf domains, so Slurm's aggregation of
    consecutive blocks reproduces the spine domains.
    """
    tree = _group(_domains_of(source))
    lines = ["# topology.conf (topology/block) written by IBEX"]
    for leaves in tree.values():
        for leaf, hosts in leaves.items():
            lines.append(f"BlockName={leaf} Nodes={compress_hostlist(hosts)}")
    if block_sizes is None:
        base = max(len(h) for leaves in tree.values() for h in leaves.values())
        block_sizes = [base]
        per_spine = {len(leaves) for leaves in tree.values()}
        if len(per_spine) == 1:
            count = per_spine.pop()
            if count > 1 and not count & (count - 1):
                block_sizes.append(base * count)
    lines.append("BlockSizes=" + ",".join(str(size) for size in block_sizes))
    return "\n".join(lines) + "\n"

"""Locality levels of a fabric: node -> leaf -> spine -> fabric.

* fat-tree: ``leaf`` = the hosts under one leaf switch; ``spine`` = the hosts under one group
  of leaves that share spine switches. A multi-rooted tree lists a leaf under many spines, so
  spines are grouped by the leaves they reach (connected components), never by picking a parent.
* rail-optimised: a host is cabled to several leaves (one per rail); the ``leaf`` domain is the
  set of leaves its hosts share (the scalable unit), again as connected components, so a host
  with one broken rail cable still lands in its scalable unit.
* dragonfly: ``leaf`` = a router, ``spine`` = its group.
* 3D torus: ``leaf`` = a router, ``spine`` = the aligned sub-box (``spec.sub_box``) holding it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from fabric.core.hostlist import natural_sorted
from fabric.core.locality import LEVELS
from fabric.core.spec import Coords, FabricSpec


@dataclass(frozen=True)
class NodeDomains:
    leaf: str
    spine: str
    coords: Coords | None = None  # torus: position of the host's router


@dataclass(frozen=True)
class FabricLevels:
    """Everything levels.py learns about a spec, for summaries and snapshots."""

    nodes: dict[str, NodeDomains]
    tiers: dict[str, str]  # switch guid -> "leaf" | "spine" | "core" | "router"
    switch_leaf: dict[str, str]  # switch guid -> leaf domain, for switches inside one
    switch_spine: dict[str, str]  # switch guid -> spine domain, for switches inside one


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, item: str) -> str:
        parent = self.parent.setdefault(item, item)
        if parent == item:
            return item
        root = self.find(parent)
        self.parent[item] = root
        return root

    def union(self, first: str, second: str) -> None:
        root_a, root_b = self.find(first), self.find(second)
        if root_a != root_b:
            # Deterministic root choice keeps results independent of input order.
            low, high = sorted((root_a, root_b))
            self.parent[high] = low

    def components(self, items: Iterable[str]) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for item in items:
            groups.setdefault(self.find(item), []).append(item)
        return groups


def group_name(names: Iterable[str]) -> str:
    """One switch keeps its name; a group is named ``first..last`` in natural order."""
    ordered = natural_sorted(set(names))
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]}..{ordered[-1]}"


def _host_of_guid(spec: FabricSpec) -> dict[str, str]:
    return {hca.guid: hca.host for hca in spec.hcas}


def _adjacency(spec: FabricSpec) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """host -> switches it is cabled to, and switch -> neighbouring switches."""
    host_of = _host_of_guid(spec)
    host_switches: dict[str, set[str]] = {}
    switch_neighbours: dict[str, set[str]] = {s.guid: set() for s in spec.switches}
    for link in spec.links:
        a_host, b_host = host_of.get(link.a_guid), host_of.get(link.b_guid)
        if a_host is not None:
            host_switches.setdefault(a_host, set()).add(link.b_guid)
        elif b_host is not None:
            host_switches.setdefault(b_host, set()).add(link.a_guid)
        else:
            switch_neighbours[link.a_guid].add(link.b_guid)
            switch_neighbours[link.b_guid].add(link.a_guid)
    return host_switches, switch_neighbours


def _infer_tiers(
    spec: FabricSpec, host_switches: dict[str, set[str]], neighbours: dict[str, set[str]]
) -> dict[str, str]:
    """Keep tiers the source gives; otherwise leaf = has hosts, spine = next to a leaf."""
    with_hosts = set().union(*host_switches.values()) if host_switches else set()
    tiers = {s.guid: s.tier for s in spec.switches if s.tier}
    for switch in spec.switches:
        if switch.guid not in tiers and switch.guid in with_hosts:
            tiers[switch.guid] = "leaf"
    leaves = {guid for guid, tier in tiers.items() if tier == "leaf"}
    for switch in spec.switches:
        if switch.guid not in tiers:
            tiers[switch.guid] = "spine" if neighbours[switch.guid] & leaves else "core"
    return tiers


def _leaf_groups(
    spec: FabricSpec, host_switches: dict[str, set[str]]
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """host -> leaf group root, and root -> leaf switch guids of that group."""
    union = _UnionFind()
    host_root: dict[str, str] = {}
    for host in spec.hosts:
        switches = host_switches.get(host)
        if not switches:
            raise ValueError(f"host {host} is not cabled to any switch")
        first, *others = sorted(switches)
        for other in others:
            union.union(first, other)
    for host in spec.hosts:
        host_root[host] = union.find(min(host_switches[host]))
    leaf_guids = set().union(*host_switches.values())
    return host_root, union.components(sorted(leaf_guids))


def analyse(spec: FabricSpec) -> FabricLevels:
    switches = spec.switch_by_guid()
    host_switches, neighbours = _adjacency(spec)
    tiers = _infer_tiers(spec, host_switches, neighbours)
    host_root, leaf_groups = _leaf_groups(spec, host_switches)
    leaf_name = {
        root: group_name(switches[guid].name for guid in members)
        for root, members in leaf_groups.items()
    }
    switch_leaf = {guid: leaf_name[root] for root, members in leaf_groups.items() for guid in members}
    if spec.kind == "dragonfly":
        root_spine, switch_spine = _dragonfly_spines(spec, leaf_groups)
    elif spec.kind == "torus":
        root_spine, switch_spine = _torus_spines(spec, leaf_groups)
    else:
        root_spine, switch_spine = _tree_spines(
            spec, leaf_groups, leaf_name, tiers, neighbours
        )
    nodes = {}
    for host in spec.hosts:
        root = host_root[host]
        coords = switches[root].coords if spec.kind == "torus" else None
        nodes[host] = NodeDomains(leaf=leaf_name[root], spine=root_spine[root], coords=coords)
    return FabricLevels(nodes=nodes, tiers=tiers, switch_leaf=switch_leaf, switch_spine=switch_spine)


def compute_domains(spec: FabricSpec) -> dict[str, NodeDomains]:
    """host -> its leaf and spine domain names (hosts in natural order)."""
    return analyse(spec).nodes


_Spines = tuple[dict[str, str], dict[str, str]]  # leaf-group root -> spine, switch -> spine


def _tree_spines(
    spec: FabricSpec,
    leaf_groups: dict[str, list[str]],
    leaf_name: dict[str, str],
    tiers: dict[str, str],
    neighbours: dict[str, set[str]],
) -> _Spines:
    """Join leaf groups that share any spine switch; name each join by its spines."""
    switches = spec.switch_by_guid()
    union = _UnionFind()
    group_of_leaf = {guid: root for root, members in leaf_groups.items() for guid in members}
    spine_members: dict[str, set[str]] = {}
    for root in leaf_groups:
        union.find(root)
    for guid, tier in sorted(tiers.items()):
        if tier != "spine":
            continue
        reached = sorted({group_of_leaf[n] for n in neighbours[guid] if n in group_of_leaf})
        for other in reached[1:]:
            union.union(reached[0], other)
        if reached:
            spine_members.setdefault(reached[0], set()).add(guid)
    spines_of_component: dict[str, set[str]] = {}
    for first_root, guids in spine_members.items():
        spines_of_component.setdefault(union.find(first_root), set()).update(guids)
    root_spine: dict[str, str] = {}
    switch_spine: dict[str, str] = {}
    for component, roots in union.components(sorted(leaf_groups)).items():
        spine_guids = spines_of_component.get(component, set())
        if spine_guids:
            name = group_name(switches[g].name for g in spine_guids)
        else:  # leaves with nothing above them: the leaf group is its own spine domain
            name = group_name(leaf_name[root] for root in roots)
        for root in roots:
            root_spine[root] = name
            for guid in leaf_groups[root]:
                switch_spine[guid] = name
        for guid in spine_guids:
            switch_spine[guid] = name
    return root_spine, switch_spine


def _dragonfly_spines(spec: FabricSpec, leaf_groups: dict[str, list[str]]) -> _Spines:
    switches = spec.switch_by_guid()
    root_spine = {}
    for root, members in leaf_groups.items():
        groups = natural_sorted({switches[g].group or switches[g].name for g in members})
        root_spine[root] = groups[0]
    switch_spine = {s.guid: s.group or s.name for s in spec.switches}
    return root_spine, switch_spine


def box_name(coords: Coords, sub_box: Coords) -> str:
    x, y, z = (c // size for c, size in zip(coords, sub_box, strict=True))
    return f"box-{x}-{y}-{z}"


def _torus_spines(spec: FabricSpec, leaf_groups: dict[str, list[str]]) -> _Spines:
    switch_spine = {}
    for switch in spec.switches:
        if switch.coords is None:
            raise ValueError(f"torus router {switch.name} has no coordinates")
        switch_spine[switch.guid] = box_name(switch.coords, spec.sub_box)
    # A leaf group's root is one of its routers (a guid).
    root_spine = {root: switch_spine[root] for root in leaf_groups}
    return root_spine, switch_spine


def _ratio(down: float, up: float) -> float | None:
    return round(down / up, 3) if up > 0 and down > 0 else None


def summarise(spec: FabricSpec) -> dict:
    """Levels, domain counts, link rates and oversubscription (down : up bandwidth) per tier."""
    levels = analyse(spec)
    host_guids = {hca.guid for hca in spec.hcas}
    switches = spec.switch_by_guid()
    rank = {"leaf": 0, "spine": 1, "core": 2}
    down: Counter[str] = Counter()
    up: Counter[str] = Counter()
    for link in spec.links:
        if link.rate_gbps is None:
            continue
        ends = [g for g in (link.a_guid, link.b_guid) if g not in host_guids]
        if len(ends) == 1:  # host link: the switch's downward bandwidth
            down[levels.tiers[ends[0]]] += link.rate_gbps
            continue
        tier_a, tier_b = levels.tiers[link.a_guid], levels.tiers[link.b_guid]
        if spec.kind == "dragonfly":
            if switches[link.a_guid].group != switches[link.b_guid].group:
                up["router"] += 2 * link.rate_gbps  # both ends lead out of their group
            continue
        if tier_a in rank and tier_b in rank and rank[tier_a] != rank[tier_b]:
            lower, upper = sorted((tier_a, tier_b), key=rank.__getitem__)
            up[lower] += link.rate_gbps
            down[upper] += link.rate_gbps
    oversubscription = {}
    if spec.kind == "dragonfly":
        pairs = [("router:global", "router")]
    else:
        pairs = [("leaf:spine", "leaf"), ("spine:core", "spine")]
    for label, tier in pairs:
        ratio = _ratio(down[tier], up[tier])
        if ratio is not None:
            oversubscription[label] = ratio
    nodes = levels.nodes
    rates = Counter(link.rate_gbps for link in spec.links if link.rate_gbps is not None)
    summary = {
        "kind": spec.kind,
        "levels": list(LEVELS),
        "domain_counts": {
            "node": len(nodes),
            "leaf": len({d.leaf for d in nodes.values()}),
            "spine": len({d.spine for d in nodes.values()}),
            "fabric": 1 if nodes else 0,
        },
        "gpus": sum(spec.gpus_of(host) for host in nodes),
        "switches_per_tier": dict(sorted(Counter(levels.tiers.values()).items())),
        "link_rates_gbps": dict(sorted(rates.items())),
        "rail_optimised": _is_rail_optimised(spec),
        "oversubscription": oversubscription,
    }
    if spec.kind == "torus":
        summary["torus_dims"], summary["sub_box"] = spec.torus_dims, spec.sub_box
    return summary


def _is_rail_optimised(spec: FabricSpec) -> bool:
    host_switches, _ = _adjacency(spec)
    return any(len(switches) > 1 for switches in host_switches.values())

"""Synthetic fabrics: fat-trees (optionally rail-optimised), dragonflies and 3D tori.

Names are zero-padded and GUIDs derived from names, so the same arguments always give the same
fabric, and re-saving a generated fabric updates rows in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fabric.core.spec import Coords, FabricSpec, HcaSpec, LinkSpec, SwitchSpec, synthetic_guid


def _width(count: int) -> int:
    return max(2, len(str(count)))


@dataclass
class _Builder:
    """Collects switches, HCAs and links while handing out port numbers in order."""

    rate_gbps: float
    switches: list[SwitchSpec] = field(default_factory=list)
    hcas: list[HcaSpec] = field(default_factory=list)
    links: list[LinkSpec] = field(default_factory=list)
    next_port: dict[str, int] = field(default_factory=dict)

    def switch(self, name, tier, group=None, coords=None) -> str:
        guid = synthetic_guid("switch", name)
        self.switches.append(SwitchSpec(guid, name, tier, 0, group=group, coords=coords))
        self.next_port[guid] = 1
        return guid

    def _port(self, guid: str) -> int:
        port = self.next_port[guid]
        self.next_port[guid] = port + 1
        return port

    def host_link(self, host: str, hca_index: int, switch_guid: str) -> None:
        guid = synthetic_guid("hca", f"{host}/{hca_index}")
        self.hcas.append(HcaSpec(guid, host, 1, f"{host} mlx5_{hca_index}"))
        self.links.append(LinkSpec(guid, 1, switch_guid, self._port(switch_guid), self.rate_gbps, "4x"))

    def switch_link(self, lower: str, upper: str) -> None:
        self.links.append(
            LinkSpec(lower, self._port(lower), upper, self._port(upper), self.rate_gbps, "4x")
        )

    def spec(self, kind: str, gpus_per_node: int, **extra) -> FabricSpec:
        # Port counts are known only once every cable is laid.
        switches = tuple(
            SwitchSpec(s.guid, s.name, s.tier, self.next_port[s.guid] - 1, s.group, s.coords)
            for s in self.switches
        )
        return FabricSpec(
            kind, switches, tuple(self.hcas), tuple(self.links), gpus_per_node, **extra
        )


def _host_names(count: int, prefix: str) -> list[str]:
    width = _width(count)
    return [f"{prefix}{i:0{width}d}" for i in range(1, count + 1)]


def fat_tree(
    nodes: int,
    radix: int,
    tiers: int = 2,
    gpus_per_node: int = 8,
    rate_gbps: float = 400,
    rails: int = 1,
    prefix: str = "node",
) -> FabricSpec:
    """A non-blocking 2- or 3-tier fat-tree of ``radix``-port switches.

    A leaf uses half its ports for hosts and half for spines. With ``rails > 1`` it is
    rail-optimised: hosts come in scalable units of ``radix/2`` hosts, each host having one HCA
    per rail cabled to that rail's leaf of its unit. Three tiers group ``radix/2`` leaves into a
    pod with ``radix/2`` pod spines; spine j of every pod reaches core block j.
    """
    if tiers not in (2, 3):
        raise ValueError("tiers must be 2 or 3")
    if radix < 2 or radix % 2 or nodes < 1 or rails < 1:
        raise ValueError("need nodes >= 1, rails >= 1 and an even radix >= 2")
    half = radix // 2
    if tiers == 3 and half % rails:
        raise ValueError("rails must divide radix/2 so that no scalable unit straddles pods")
    units = math.ceil(nodes / half)  # a unit is one leaf (rails=1) or one scalable unit
    leaf_count = units * rails
    max_leaves = radix if tiers == 2 else radix * half
    if leaf_count > max_leaves:
        raise ValueError(f"{nodes} nodes x {rails} rails need {leaf_count} leaves, radix {radix} "
                         f"with {tiers} tiers allows {max_leaves}")
    builder = _Builder(rate_gbps)
    hosts = _host_names(nodes, prefix)
    leaf_width, unit_width = _width(leaf_count), _width(units)
    leaves = []
    for unit in range(units):
        unit_hosts = hosts[unit * half : (unit + 1) * half]
        for rail in range(rails):
            if rails == 1:
                name = f"leaf{unit + 1:0{leaf_width}d}"
            else:
                name = f"su{unit + 1:0{unit_width}d}-rail{rail + 1}"
            leaf = builder.switch(name, "leaf")
            leaves.append(leaf)
            for host in unit_hosts:
                builder.host_link(host, rail, leaf)
    if tiers == 2:
        spine_width = _width(half)
        spines = [builder.switch(f"spine{j + 1:0{spine_width}d}", "spine") for j in range(half)]
        for leaf in leaves:
            for spine in spines:
                builder.switch_link(leaf, spine)
        return builder.spec("fat-tree" if rails == 1 else "rail-optimised", gpus_per_node)
    pods = math.ceil(leaf_count / half)
    pod_width, spine_width = _width(pods), _width(half)
    core_width = _width(half * half)
    cores = [builder.switch(f"core{c + 1:0{core_width}d}", "core") for c in range(half * half)]
    for pod in range(pods):
        spines = [
            builder.switch(f"pod{pod + 1:0{pod_width}d}-spine{j + 1:0{spine_width}d}", "spine")
            for j in range(half)
        ]
        for leaf in leaves[pod * half : (pod + 1) * half]:
            for spine in spines:
                builder.switch_link(leaf, spine)
        for j, spine in enumerate(spines):
            for core in cores[j * half : (j + 1) * half]:
                builder.switch_link(spine, core)
    return builder.spec("fat-tree" if rails == 1 else "rail-optimised", gpus_per_node)


def dragonfly(
    a: int,
    p: int,
    h: int,
    gpus_per_node: int = 8,
    rate_gbps: float = 200,
    prefix: str = "node",
) -> FabricSpec:
    """A balanced dragonfly: ``a`` routers per group, ``p`` hosts per router, ``h`` global links
    per router, and ``a*h + 1`` groups so every pair of groups shares exactly one global link.
    Routers are all-to-all inside a group.
    """
    if min(a, p, h) < 1:
        raise ValueError("a, p and h must be at least 1")
    groups = a * h + 1
    builder = _Builder(rate_gbps)
    hosts = iter(_host_names(groups * a * p, prefix))
    group_width, router_width = _width(groups), _width(a)
    routers = []
    for g in range(groups):
        group = f"g{g + 1:0{group_width}d}"
        members = [
            builder.switch(f"{group}-r{r + 1:0{router_width}d}", "router", group=group)
            for r in range(a)
        ]
        routers.append(members)
        for router in members:
            for _ in range(p):
                builder.host_link(next(hosts), 0, router)
        for i, first in enumerate(members):
            for second in members[i + 1 :]:
                builder.switch_link(first, second)
    # Global port k of group g (owned by router k // h) leads to group k, or k + 1 past itself.
    for g in range(groups):
        for k in range(a * h):
            target = k if k < g else k + 1
            if target < g:
                continue  # laid already from the other side
            back = g  # the port of the target group that leads back to g (g < target)
            builder.switch_link(routers[g][k // h], routers[target][back // h])
    return builder.spec("dragonfly", gpus_per_node)


def torus(
    x: int,
    y: int,
    z: int,
    gpus_per_node: int = 8,
    rate_gbps: float = 200,
    hosts_per_router: int = 1,
    sub_box: Coords = (4, 4, 4),
    prefix: str = "node",
) -> FabricSpec:
    """A 3D torus of routers with wrap-around links; each router serves ``hosts_per_router``."""
    dims = (x, y, z)
    if min(dims) < 1 or hosts_per_router < 1:
        raise ValueError("torus dimensions and hosts_per_router must be at least 1")
    builder = _Builder(rate_gbps)
    widths = [len(str(d - 1)) for d in dims]
    hosts = iter(_host_names(x * y * z * hosts_per_router, prefix))
    router_at: dict[Coords, str] = {}
    for i in range(x):
        for j in range(y):
            for k in range(z):
                name = f"r{i:0{widths[0]}d}-{j:0{widths[1]}d}-{k:0{widths[2]}d}"
                router = builder.switch(name, "router", coords=(i, j, k))
                router_at[(i, j, k)] = router
                for _ in range(hosts_per_router):
                    builder.host_link(next(hosts), 0, router)
    for (i, j, k), router in router_at.items():
        for axis in range(3):
            if dims[axis] == 1:
                continue  # a ring of one router has no neighbour
            if dims[axis] == 2 and (i, j, k)[axis] == 1:
                continue  # a ring of two is one cable, laid from position 0
            step = [i, j, k]
            step[axis] = (step[axis] + 1) % dims[axis]
            builder.switch_link(router, router_at[tuple(step)])
    clipped = tuple(min(size, dim) for size, dim in zip(sub_box, dims, strict=True))
    return builder.spec("torus", gpus_per_node, torus_dims=dims, sub_box=clipped)

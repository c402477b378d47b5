"""Test helper: a small FabricSpec from a readable description of who is cabled to whom."""

from __future__ import annotations

from fabric.core.spec import FabricSpec, HcaSpec, LinkSpec, SwitchSpec, synthetic_guid


def tree_spec(
    hosts: dict[str, list[str]],
    uplinks: dict[str, list[str]],
    host_gbps: float = 100,
    uplink_gbps: float = 100,
    tiers: dict[str, str] | None = None,
    gpus_per_node: int = 8,
) -> FabricSpec:
    """``hosts``: host -> switches its HCAs are cabled to (one HCA each);
    ``uplinks``: switch -> upper switches (one cable each). Tiers are left to inference
    unless given."""
    names = {s for leaves in hosts.values() for s in leaves}
    names |= set(uplinks) | {s for ups in uplinks.values() for s in ups}
    guid = {name: synthetic_guid("switch", name) for name in names}
    port = dict.fromkeys(names, 0)

    def next_port(name):
        port[name] += 1
        return port[name]

    hcas, links = [], []
    for host, switches in hosts.items():
        for index, switch in enumerate(switches):
            hca = synthetic_guid("hca", f"{host}/{index}")
            hcas.append(HcaSpec(hca, host, 1, f"{host} mlx5_{index}"))
            links.append(LinkSpec(hca, 1, guid[switch], next_port(switch), host_gbps, "4x"))
    for lower, uppers in uplinks.items():
        for upper in uppers:
            links.append(LinkSpec(guid[lower], next_port(lower), guid[upper], next_port(upper),
                                  uplink_gbps, "4x"))
    tiers = tiers or {}
    switches = tuple(
        SwitchSpec(guid[name], name, tiers.get(name), port[name]) for name in sorted(names)
    )
    return FabricSpec("fat-tree", switches, tuple(hcas), tuple(links), gpus_per_node)

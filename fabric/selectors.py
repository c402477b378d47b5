"""Read-only views of fabrics built from the database in a few bulk queries."""

from __future__ import annotations

from fabric.core.levels import NodeDomains
from fabric.core.slurm import export_slurm_block, export_slurm_tree
from fabric.core.topology import SnapshotNode, TopologySnapshot
from fabric.models import Fabric, Host

EXPORT_FORMATS = ("slurm-tree", "slurm-block")


def _host_rows(fabric: Fabric):
    return Host.objects.filter(fabric=fabric).values_list(
        "name", "leaf", "spine", "gpus", "coords", "bandwidth_gbps"
    ).iterator(chunk_size=20_000)


def load_snapshot(fabric: Fabric) -> TopologySnapshot:
    """The fabric's immutable topology snapshot: one query over its hosts."""
    nodes, host_gbps = [], {}
    for name, leaf, spine, gpus, coords, gbps in _host_rows(fabric):
        nodes.append(SnapshotNode(name, leaf, spine, gpus, tuple(coords) if coords else None))
        host_gbps[name] = gbps
    uplinks = fabric.summary.get("uplink_gbps", {})
    return TopologySnapshot.from_domains(
        nodes, kind=fabric.kind if fabric.kind != "single-switch" else "fat-tree",
        name=fabric.name, torus_dims=tuple(fabric.torus_dims) if fabric.torus_dims else None,
        host_gbps=host_gbps, leaf_uplink_gbps=uplinks.get("leaf"),
        spine_uplink_gbps=uplinks.get("spine"),
    )


def node_domains(fabric: Fabric) -> dict[str, NodeDomains]:
    return {
        name: NodeDomains(leaf=leaf, spine=spine, coords=tuple(coords) if coords else None)
        for name, leaf, spine, _gpus, coords, _gbps in _host_rows(fabric)
    }


def export_topology_conf(fabric: Fabric, fmt: str) -> str:
    domains = node_domains(fabric)
    if fmt == "slurm-tree":
        rate = float(fabric.link_rate_gbps) if fabric.link_rate_gbps is not None else None
        return export_slurm_tree(domains, top_name=fabric.name, link_speed=rate)
    if fmt == "slurm-block":
        return export_slurm_block(domains)
    raise ValueError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")

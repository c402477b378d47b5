"""The cluster CSV, `--fabric` labelling, and the `make-cluster` generator.

Columns: node,gpu_model,gpus,gpu_memory_mib,cpu_milli,memory_mib,leaf,spine. Nodes without a
leaf and spine are labelled by the `--fabric` generator in file order; without `--fabric` they
form one flat domain (leaf and spine both `flat`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace

from fabric.core.generators import dragonfly, fat_tree, torus
from fabric.core.spec import FabricSpec
from fabric.core.topology import SnapshotNode, TopologySnapshot
from scheduler.simulate.csvread import read_rows
from scheduler.simulate.errors import InputError

CLUSTER_COLUMNS = ("node", "gpu_model", "gpus", "gpu_memory_mib", "cpu_milli", "memory_mib",
                   "leaf", "spine")
FLAT = "flat"


@dataclass(frozen=True)
class ClusterNode:
    name: str
    gpu_model: str
    gpus: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    leaf: str = ""
    spine: str = ""


@dataclass(frozen=True)
class Cluster:
    """Nodes in file order, every one labelled, and the fabric snapshot built from them."""

    nodes: tuple[ClusterNode, ...]
    snapshot: TopologySnapshot

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)


def load_cluster_nodes(path: str) -> list[ClusterNode]:
    nodes: list[ClusterNode] = []
    seen: set[str] = set()
    for row in read_rows(path, CLUSTER_COLUMNS):
        name = row.text("node")
        if not name:
            raise row.error("node is empty")
        if name in seen:
            raise row.error(f"node {name} appears twice")
        seen.add(name)
        nodes.append(ClusterNode(
            name=name,
            gpu_model=row.text("gpu_model"),
            gpus=row.count("gpus"),
            gpu_memory_mib=row.count("gpu_memory_mib"),
            cpu_milli=row.count("cpu_milli"),
            memory_mib=row.count("memory_mib"),
            leaf=row.text("leaf"),
            spine=row.text("spine"),
        ))
    if not nodes:
        raise InputError(path, None, "no nodes")
    if not any(node.gpus for node in nodes):
        raise InputError(path, None, "no GPUs in the cluster")
    return nodes


def load_cluster(path: str, fabric: str | None = None) -> Cluster:
    nodes = load_cluster_nodes(path)
    try:
        labelled = label_nodes(nodes, fabric)
    except ValueError as error:
        raise InputError("--fabric", None, str(error)) from None
    return Cluster(tuple(labelled), snapshot_of(labelled))


def label_nodes(nodes: list[ClusterNode], fabric: str | None) -> list[ClusterNode]:
    """Give every node a leaf and a spine: its own, the generated fabric's, or `flat`."""
    unlabelled = [node for node in nodes if not node.leaf and not node.spine]
    domains: dict[str, tuple[str, str]] = {}
    if fabric and unlabelled:
        generated = TopologySnapshot.from_spec(generate_fabric(fabric, len(unlabelled)))
        if len(generated.nodes) < len(unlabelled):
            raise ValueError(f"{fabric} has {len(generated.nodes)} hosts, "
                             f"the cluster needs {len(unlabelled)}")
        for node, host in zip(unlabelled, generated.nodes, strict=False):
            domains[node.name] = (generated.domain_of(host, "leaf"),
                                  generated.domain_of(host, "spine"))
    out = []
    for node in nodes:
        leaf, spine = domains.get(node.name, (node.leaf or FLAT, node.spine or FLAT))
        out.append(replace(node, leaf=leaf, spine=spine))
    return out


def snapshot_of(nodes: list[ClusterNode]) -> TopologySnapshot:
    return TopologySnapshot.from_domains(
        SnapshotNode(node.name, node.leaf, node.spine, node.gpus) for node in nodes
    )


FABRIC_PARAMETERS = {
    "fat-tree": ("radix", "tiers", "rails"),
    "dragonfly": ("a", "p", "h"),
    "torus": ("x", "y", "z", "hosts_per_router"),
}


def generate_fabric(text: str, nodes: int) -> FabricSpec:
    """`fat-tree:radix=32[,tiers=3][,rails=N]`, `dragonfly:a=..,p=..,h=..`,
    `torus:x=..,y=..,z=..[,hosts_per_router=N]`; a fat-tree is sized to the cluster."""
    kind, _, rest = text.partition(":")
    if kind not in FABRIC_PARAMETERS:
        raise ValueError(f"unknown fabric {kind!r} (choose {', '.join(FABRIC_PARAMETERS)})")
    parameters: dict[str, int] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in FABRIC_PARAMETERS[kind]:
            raise ValueError(f"{kind} takes {', '.join(FABRIC_PARAMETERS[kind])}, not {key!r}")
        try:
            parameters[key] = int(value)
        except ValueError:
            raise ValueError(f"{key} is not a whole number") from None
    try:
        if kind == "fat-tree":
            if "radix" not in parameters:
                raise ValueError("fat-tree needs radix=N")
            return fat_tree(nodes=nodes, **parameters)
        if kind == "dragonfly":
            return dragonfly(**parameters)
        return torus(**parameters)
    except TypeError as error:  # a required parameter is missing
        raise ValueError(f"{kind}: {error}") from None


def write_cluster(path: str, nodes: list[ClusterNode]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CLUSTER_COLUMNS)
        for node in nodes:
            writer.writerow([node.name, node.gpu_model, node.gpus, node.gpu_memory_mib,
                             node.cpu_milli, node.memory_mib, node.leaf, node.spine])


def make_nodes(count: int, gpus: int, gpu_model: str, gpu_memory_mib: int, cpu_milli: int,
               memory_mib: int, prefix: str = "node") -> list[ClusterNode]:
    """`count` identical nodes, unlabelled (for `--fabric` to place)."""
    width = max(2, len(str(count)))
    return [
        ClusterNode(f"{prefix}{i:0{width}d}", gpu_model, gpus, gpu_memory_mib, cpu_milli,
                    memory_mib)
        for i in range(1, count + 1)
    ]

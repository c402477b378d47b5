"""Small hand-drawn topologies for the placement tests, written as {"spine/leaf/node": free}."""

from __future__ import annotations

from scheduler.core.placement import Node

LEVELS = ("spine", "leaf", "node")
H100 = "H100-80GB"


def nodes_from(free_by_path: dict[str, int], levels=LEVELS, model: str = H100) -> list[Node]:
    nodes = []
    for path, free in free_by_path.items():
        *domains, name = path.split("/")
        labels = dict(zip(levels[:-1], domains, strict=True))
        nodes.append(Node(name=name, labels=labels, free_gpus=free, gpu_model=model))
    return nodes


# Topology A: two spines, four leaves, eight nodes; leaf free 16, 6, 16, 8; spine free 22, 24.
TOPOLOGY_A = nodes_from({
    "s1/l1/n1": 8, "s1/l1/n2": 8,
    "s1/l2/n3": 4, "s1/l2/n4": 2,
    "s2/l3/n5": 8, "s2/l3/n6": 6, "s2/l3/n7": 2,
    "s2/l4/n8": 8,
})

# Topology B, for whole-node slices of 8: leaf l1 holds 2 slices (21 GPUs), l2 1 slice
# (15 GPUs), l3 3 slices (24 GPUs); both spines hold 3 slices.
TOPOLOGY_B = nodes_from({
    "s1/l1/n1": 8, "s1/l1/n2": 8, "s1/l1/n3": 5,
    "s1/l2/n4": 8, "s1/l2/n5": 7,
    "s2/l3/n6": 8, "s2/l3/n7": 8, "s2/l3/n8": 8,
})

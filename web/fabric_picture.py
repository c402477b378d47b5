"""Lay out a fabric for an SVG picture: spine blocks, the leaves inside them, the nodes inside
the leaves. Pure Python: positions only; the template draws them."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from fabric.core.hostlist import natural_sorted
from fabric.core.levels import NodeDomains

CELL = 30  # one node square, with its gap
NODE = 24
LEAF_COLUMNS = 8
LEAF_PAD = 10
LEAF_HEAD = 18
SPINE_PAD = 12
SPINE_HEAD = 24
GAP = 12


@dataclass
class NodeMark:
    name: str
    x: int
    y: int
    fill: str  # a CSS class: free / partial / full / out / unregistered
    title: str


@dataclass
class Box:
    name: str
    x: int
    y: int
    width: int
    height: int
    children: list = field(default_factory=list)


@dataclass(frozen=True)
class NodeState:
    gpus: int
    leased: int
    available: bool  # active, reachable
    title: str


def fill_of(state: NodeState | None) -> str:
    if state is None:
        return "unregistered"
    if state.leased >= state.gpus > 0:
        return "full"
    if state.leased > 0:
        return "partial"
    return "free" if state.available else "out"


def layout(domains: dict[str, NodeDomains], states: dict[str, NodeState], *,
           width: int = 1100) -> tuple[list[Box], int, int]:
    """Spine boxes (each holding leaf boxes holding node marks), and the picture's width and
    height: spine boxes are as wide as the widest one needs, at most `width`."""
    tree: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for host, where in domains.items():
        tree[where.spine][where.leaf].append(host)
    spines, y = [], 0
    for spine in natural_sorted(tree):
        box = Box(spine, 0, y, width, 0)
        x, row_y, row_height = SPINE_PAD, y + SPINE_HEAD, 0
        for leaf in natural_sorted(tree[spine]):
            hosts = natural_sorted(tree[spine][leaf])
            columns = min(len(hosts), LEAF_COLUMNS)
            rows = -(-len(hosts) // LEAF_COLUMNS)
            leaf_w = max(columns * CELL + 2 * LEAF_PAD - (CELL - NODE), 90)
            leaf_h = LEAF_HEAD + rows * CELL + LEAF_PAD - (CELL - NODE)
            if x + leaf_w > width - SPINE_PAD and x > SPINE_PAD:
                x, row_y, row_height = SPINE_PAD, row_y + row_height + GAP, 0
            leaf_box = Box(leaf, x, row_y, leaf_w, leaf_h)
            for i, host in enumerate(hosts):
                state = states.get(host)
                leaf_box.children.append(NodeMark(
                    host, x + LEAF_PAD + (i % LEAF_COLUMNS) * CELL,
                    row_y + LEAF_HEAD + (i // LEAF_COLUMNS) * CELL, fill_of(state),
                    state.title if state else f"{host}: not registered as a node"))
            box.children.append(leaf_box)
            x += leaf_w + GAP
            row_height = max(row_height, leaf_h)
        box.height = row_y + row_height + SPINE_PAD - y
        box.width = max([leaf.x + leaf.width + SPINE_PAD for leaf in box.children] + [200])
        spines.append(box)
        y += box.height + GAP
    used = max([spine.width for spine in spines] + [200])
    for spine in spines:
        spine.width = used
    return spines, used, max(y - GAP, 0)

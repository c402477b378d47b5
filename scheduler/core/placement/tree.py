"""The capacity tree under the placement index: topology domains with free capacity per domain.

Every domain keeps, per GPU model, the free GPUs of its schedulable nodes and a histogram of
those nodes by free-GPU count. The histogram answers "best-fit node under this domain" and
"whole slices of k GPUs on nodes" without visiting nodes, and commit / release update only
the ancestors of the nodes touched, so one index serves many placements. The tree answers no
request itself: the gang placer (`gang.py`) reads it, and `index.PlacementIndex` puts the two
together, so this module imports neither.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from market.core.whatif import InvalidInput
from scheduler.core.placement.model import Node


class Domain:
    """One switch domain (or the root, or one node); mutable, owned by its index."""

    __slots__ = ("name", "depth", "path", "parent", "children", "free", "total", "hist", "node")

    def __init__(self, name: str, depth: int, path: tuple[str, ...], parent: Domain | None):
        self.name = name
        self.depth = depth
        self.path = path
        self.parent = parent
        self.children: list[Domain] = []
        self.free: Counter[str] = Counter()  # model -> free GPUs on schedulable nodes
        self.total: Counter[str] = Counter()  # model -> all GPUs of schedulable nodes
        self.hist: dict[str, list[int]] = {}  # model -> count of nodes by free GPUs
        self.node: Node | None = None

    def __repr__(self) -> str:
        return f"Domain({'/'.join(self.path) or '<root>'})"


class CapacityTree:
    """Levels plus nodes, indexed once; commit or release allocations.

    Depth 0 is the whole topology (the root); depth i is `levels[i - 1]`; the last level holds
    single nodes. Children are kept sorted by name, so ties resolve by path, never input order.
    """

    def __init__(self, levels: Sequence[str], nodes: Iterable[Node]) -> None:
        self.levels = tuple(levels)
        if not self.levels:
            raise InvalidInput("levels", "must name at least the node level")
        if len(set(self.levels)) != len(self.levels):
            raise InvalidInput("levels", "must not repeat a level")
        self.root = Domain("", 0, (), None)
        self.node_domains: dict[str, Domain] = {}
        self.free_gpus_by_node: dict[str, int] = {}
        self.by_depth: list[list[Domain]] = [[self.root]] + [[] for _ in self.levels]
        nodes = list(nodes)
        self.hist_size = 1 + max((node.capacity_gpus for node in nodes), default=0)
        self.models: frozenset[str] = frozenset(node.gpu_model for node in nodes)
        self.node_classes: Counter[tuple[str, str, bool]] = Counter()
        self._switch_domains: dict[tuple[str, ...], Domain] = {}
        for position, node in enumerate(nodes):
            self._add_node(position, node)
        self._sort_by_path()

    def _add_node(self, position: int, node: Node) -> None:
        if node.name in self.node_domains:
            raise InvalidInput(f"nodes[{position}].name", f"duplicate node {node.name!r}")
        parent = self.root
        for level in self.levels[:-1]:
            label = node.labels.get(level)
            if not isinstance(label, str) or not label:
                raise InvalidInput(f"nodes[{position}].labels.{level}", "missing label")
            parent = self._child(parent, label)
        leaf = Domain(node.name, parent.depth + 1, parent.path + (node.name,), parent)
        leaf.node = node
        parent.children.append(leaf)
        self.by_depth[leaf.depth].append(leaf)
        self.node_domains[node.name] = leaf
        self.free_gpus_by_node[node.name] = node.free_gpus
        self.node_classes[(node.gpu_model, node.state, node.healthy)] += 1
        if is_schedulable(node):
            self._shift(leaf, node.gpu_model, None, node.free_gpus)
            domain: Domain | None = leaf
            while domain is not None:
                domain.total[node.gpu_model] += node.capacity_gpus
                domain = domain.parent

    def _child(self, parent: Domain, name: str) -> Domain:
        path = parent.path + (name,)
        child = self._switch_domains.get(path)
        if child is None:
            child = self._switch_domains[path] = Domain(name, parent.depth + 1, path, parent)
            parent.children.append(child)
            self.by_depth[child.depth].append(child)
        return child

    def _sort_by_path(self) -> None:
        for domains in self.by_depth:
            domains.sort(key=lambda domain: domain.path)
            for domain in domains:
                domain.children.sort(key=lambda child: child.name)

    def _shift(self, leaf: Domain, model: str, old: int | None, new: int | None) -> None:
        """Move one node from histogram bucket `old` to `new` on it and all its ancestors."""
        delta = (new or 0) - (old or 0)
        domain: Domain | None = leaf
        while domain is not None:
            hist = domain.hist.get(model)
            if hist is None:
                hist = domain.hist[model] = [0] * self.hist_size
            if old is not None:
                hist[old] -= 1
            if new is not None:
                hist[new] += 1
            domain.free[model] += delta
            domain = domain.parent

    @property
    def node_depth(self) -> int:
        return len(self.levels)

    def depth_of(self, level: str, field: str) -> int:
        try:
            return self.levels.index(level) + 1
        except ValueError:
            raise InvalidInput(field, f"unknown level {level!r}") from None

    def free_gpus(self, node_name: str) -> int:
        return self.free_gpus_by_node[node_name]

    def commit(self, assignment: Mapping[str, int]) -> None:
        """Take the GPUs of an assignment; all or nothing."""
        self._check(assignment, taking=True)
        for name, gpus in assignment.items():
            self._set_free(name, self.free_gpus_by_node[name] - gpus)

    def release(self, assignment: Mapping[str, int]) -> None:
        """Give back the GPUs of an assignment committed earlier; all or nothing."""
        self._check(assignment, taking=False)
        for name, gpus in assignment.items():
            self._set_free(name, self.free_gpus_by_node[name] + gpus)

    def _check(self, assignment: Mapping[str, int], taking: bool) -> None:
        for name, gpus in assignment.items():
            if name not in self.node_domains:
                raise InvalidInput(f"assignment.{name}", "unknown node")
            if gpus < 0:
                raise InvalidInput(f"assignment.{name}", "must not be negative")
            free = self.free_gpus_by_node[name]
            node = self.node_domains[name].node
            assert node is not None
            if taking and gpus > free:
                raise InvalidInput(f"assignment.{name}", f"takes {gpus} GPUs, {free} free")
            if not taking and free + gpus > node.capacity_gpus:
                raise InvalidInput(f"assignment.{name}", "releases more GPUs than the node has")

    def _set_free(self, name: str, new_free: int) -> None:
        leaf = self.node_domains[name]
        node = leaf.node
        assert node is not None
        old_free = self.free_gpus_by_node[name]
        self.free_gpus_by_node[name] = new_free
        if is_schedulable(node):
            self._shift(leaf, node.gpu_model, old_free, new_free)

    def current_nodes(self) -> list[Node]:
        """The nodes as they stand now (free GPUs after commits), in path order."""
        out = []
        for leaf in self.by_depth[self.node_depth]:
            node = leaf.node
            assert node is not None
            free = self.free_gpus_by_node[node.name]
            out.append(node if free == node.free_gpus else _with_free(node, free))
        return out


def is_schedulable(node: Node) -> bool:
    return node.state == "up" and node.healthy


def _with_free(node: Node, free: int) -> Node:
    return Node(
        name=node.name,
        labels=node.labels,
        free_gpus=free,
        gpu_model=node.gpu_model,
        state=node.state,
        healthy=node.healthy,
        free_cpu_milli=node.free_cpu_milli,
        free_memory_mib=node.free_memory_mib,
        total_gpus=node.capacity_gpus,
    )

"""Filter plugins: which nodes a request may use, and how many GPUs each may give it.

Like the Kubernetes scheduler framework's Filter stage, each plugin is named, and a refusal
reports how many nodes each one excluded (a node is charged to the first plugin that excludes
it). Static plugins look only at a node's GPU model, state and health: the index keeps free
capacity per GPU model over schedulable nodes only, and counts nodes by class, so they never
visit nodes. Per-node plugins (names, CPU and memory per GPU) withhold GPUs instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.placement.model import Node, Request
from scheduler.core.placement.tree import CapacityTree

# A plugin returns the GPUs the node may give the request: 0 excludes it, None sets no limit.
UsableGpus = Callable[[Node, Request], int | None]


@dataclass(frozen=True)
class FilterPlugin:
    name: str  # as a refusal names it
    static: bool  # looks only at GPU model, state and health
    limit_gpus: UsableGpus


def _gpu_model(node: Node, request: Request) -> int | None:
    if request.gpu_models is not None and node.gpu_model not in request.gpu_models:
        return 0
    return None


def _node_state(node: Node, request: Request) -> int | None:
    return 0 if node.state != "up" else None


def _health(node: Node, request: Request) -> int | None:
    return 0 if not node.healthy else None


def _excluded_by_name(node: Node, request: Request) -> int | None:
    return 0 if node.name in request.exclude_nodes else None


# CPU and memory figures are the node's as given when the index was built: the index counts
# GPUs only, so callers rebuild it when those figures change.
def _free_cpu(node: Node, request: Request) -> int | None:
    if request.min_cpu_milli_per_gpu == 0 or node.free_cpu_milli is None:
        return None
    return node.free_cpu_milli // request.min_cpu_milli_per_gpu


def _free_memory(node: Node, request: Request) -> int | None:
    if request.min_memory_mib_per_gpu == 0 or node.free_memory_mib is None:
        return None
    return node.free_memory_mib // request.min_memory_mib_per_gpu


FILTERS: tuple[FilterPlugin, ...] = (
    FilterPlugin("gpu model", True, _gpu_model),
    FilterPlugin("node state", True, _node_state),
    FilterPlugin("unhealthy", True, _health),
    FilterPlugin("excluded node", False, _excluded_by_name),
    FilterPlugin("free cpu", False, _free_cpu),
    FilterPlugin("free memory", False, _free_memory),
)


STATIC_NAMES = frozenset(plugin.name for plugin in FILTERS if plugin.static)


def needs_node_filters(request: Request) -> bool:
    """True when some non-static plugin can exclude or limit a node for this request."""
    return bool(
        request.exclude_nodes or request.min_cpu_milli_per_gpu or request.min_memory_mib_per_gpu
    )


def usable_gpus(node: Node, free_gpus: int, request: Request) -> tuple[int, str | None]:
    """GPUs this node may give, and the plugin that excluded it (None when not excluded)."""
    usable = free_gpus
    for plugin in FILTERS:
        limit = plugin.limit_gpus(node, request)
        if limit == 0:
            return 0, plugin.name
        if limit is not None:
            usable = min(usable, limit)
    return usable, None


def count_static_exclusions(index: CapacityTree, request: Request) -> dict[str, int]:
    """Nodes excluded by the static plugins, counted per (model, state, health) class."""
    counts: dict[str, int] = {}
    for (model, state, healthy), how_many in index.node_classes.items():
        example = Node(name="class", labels={}, free_gpus=0, gpu_model=model, state=state,
                       healthy=healthy)
        for plugin in FILTERS:
            if plugin.static and plugin.limit_gpus(example, request) == 0:
                counts[plugin.name] = counts.get(plugin.name, 0) + how_many
                break
    return _in_plugin_order(counts)


def withheld_gpus(index: CapacityTree, request: Request) -> tuple[dict[str, int], dict]:
    """GPUs the per-node plugins keep from this request, by node, and the nodes they excluded.

    The engine takes these GPUs out of the index for the length of one placement (commit,
    place, release), so per-node filters cost a look at the named nodes, or one pass over the
    nodes when CPU or memory per GPU is asked for, never a second index.
    """
    if request.min_cpu_milli_per_gpu or request.min_memory_mib_per_gpu:
        names = list(index.node_domains)
    else:
        names = [name for name in sorted(request.exclude_nodes) if name in index.node_domains]
    withheld: dict[str, int] = {}
    counts: dict[str, int] = {}
    for name in names:
        node = index.node_domains[name].node
        assert node is not None
        free = index.free_gpus_by_node[name]
        usable, excluded_by = usable_gpus(node, free, request)
        if excluded_by in STATIC_NAMES:
            continue  # counted per class by count_static_exclusions
        if excluded_by is not None:
            counts[excluded_by] = counts.get(excluded_by, 0) + 1
        if usable < free:
            withheld[name] = free - usable
    return withheld, counts


def merge_counts(*counts: dict[str, int]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for one in counts:
        for name, how_many in one.items():
            merged[name] = merged.get(name, 0) + how_many
    return _in_plugin_order(merged)


def _in_plugin_order(counts: dict[str, int]) -> dict[str, int]:
    return {plugin.name: counts[plugin.name] for plugin in FILTERS if plugin.name in counts}

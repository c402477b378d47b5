"""Filter plugins: which nodes a request may use, and how many GPUs each may give it.

Like the Kubernetes scheduler framework's Filter stage, each plugin is named, and a refusal
reports how many nodes each one excluded (a node is charged to the first plugin that excludes
it). Static plugins look only at a node's GPU model, state and health; the index counts nodes
by those, so requests that use only static plugins never visit nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.placement.index import PlacementIndex
from scheduler.placement.model import Node, Request

# A plugin returns the GPUs the node may give the request: 0 excludes it, None sets no limit.
UsableGpus = Callable[[Node, Request], int | None]


@dataclass(frozen=True)
class FilterPlugin:
    name: str
    static: bool
    usable_gpus: UsableGpus


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


def needs_node_filters(request: Request) -> bool:
    """True when some non-static plugin can exclude or limit a node for this request."""
    return bool(
        request.exclude_nodes or request.min_cpu_milli_per_gpu or request.min_memory_mib_per_gpu
    )


def usable_gpus(node: Node, free_gpus: int, request: Request) -> tuple[int, str | None]:
    """GPUs this node may give, and the plugin that excluded it (None when not excluded)."""
    usable = free_gpus
    for plugin in FILTERS:
        limit = plugin.usable_gpus(node, request)
        if limit == 0:
            return 0, plugin.name
        if limit is not None:
            usable = min(usable, limit)
    return usable, None


def count_static_exclusions(index: PlacementIndex, request: Request) -> dict[str, int]:
    """Nodes excluded by the static plugins, counted per (model, state, health) class."""
    counts: dict[str, int] = {}
    for (model, state, healthy), how_many in index.node_classes.items():
        example = Node(name="class", labels={}, free_gpus=0, gpu_model=model, state=state,
                       healthy=healthy)
        for plugin in FILTERS:
            if plugin.static and plugin.usable_gpus(example, request) == 0:
                counts[plugin.name] = counts.get(plugin.name, 0) + how_many
                break
    return _in_plugin_order(counts)


def filtered_index(index: PlacementIndex, request: Request) -> tuple[PlacementIndex, dict]:
    """A throw-away index holding only the usable GPUs of each node, for per-node filters.

    Costs one pass over the nodes; only requests with node-specific filters pay it.
    """
    counts: dict[str, int] = {}
    kept = []
    for node in index.current_nodes():
        usable, excluded_by = usable_gpus(node, node.free_gpus, request)
        if excluded_by is not None:
            counts[excluded_by] = counts.get(excluded_by, 0) + 1
            continue
        kept.append(Node(name=node.name, labels=node.labels, free_gpus=usable,
                         gpu_model=node.gpu_model))
    return PlacementIndex(index.levels, kept), _in_plugin_order(counts)


def _in_plugin_order(counts: dict[str, int]) -> dict[str, int]:
    return {plugin.name: counts[plugin.name] for plugin in FILTERS if plugin.name in counts}

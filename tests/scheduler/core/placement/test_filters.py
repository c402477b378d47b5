"""Filter plugins: GPU model, node state, health, excluded nodes, CPU and memory per GPU."""

import pytest

from scheduler.core.placement import Node, Request, place_gang
from tests.scheduler.core.placement.topologies import LEVELS

H100, A100 = "H100-80GB", "A100-80GB"


def node(name, leaf, free, model=H100, **extra):
    return Node(name=name, labels={"spine": "s1", "leaf": leaf}, free_gpus=free,
                gpu_model=model, **extra)


NODES = [
    node("a", "l1", 8, model=A100),
    node("b", "l1", 8, state="drain"),
    node("c", "l1", 8, healthy=False),
    node("d", "l2", 4),
    node("e", "l2", 8),
    node("f", "l2", 8, free_cpu_milli=8000, free_memory_mib=100_000),
]
STATIC = {"gpu model": 1, "node state": 1, "unhealthy": 1}


@pytest.mark.parametrize(
    "request_, expected, excluded",
    [
        # usable: d 4, e 8, f 8, all in l2; no node holds 9: within the leaf the roomiest
        # node (e) goes whole, the last GPU to the tightest node that holds it (d)
        (Request(9, gpu_models=[H100]), {"d": 1, "e": 8}, STATIC),
        # several accepted models: a counts again; leaf l2 (20) goes whole, 4 from l1's a
        (Request(24, gpu_models=[H100, A100], required="spine"),
         {"a": 4, "d": 4, "e": 8, "f": 8},
         {"node state": 1, "unhealthy": 1}),
        # e excluded by name; f has CPU for 2 GPUs at 4000 milli each
        (Request(6, gpu_models=[H100], exclude_nodes=["e"], min_cpu_milli_per_gpu=4000),
         {"d": 4, "f": 2}, STATIC | {"excluded node": 1}),
        # f has memory for 2 GPUs at 40 GiB each; nodes without a figure are not limited
        (Request(2, gpu_models=[H100], exclude_nodes=["d", "e"], min_memory_mib_per_gpu=40_960),
         {"f": 2}, STATIC | {"excluded node": 2}),
    ],
)
def test_filters_limit_which_nodes_and_how_many_gpus(request_, expected, excluded):
    placement = place_gang(LEVELS, NODES, request_)
    assert placement.placed, placement.reason
    assert dict(placement.assignment) == expected
    assert dict(placement.excluded) == excluded


@pytest.mark.parametrize(
    "request_, reason",
    [
        (Request(30, gpu_models=[H100]),
         "only 20 of 30 GPUs fit; excluded: gpu model: 1, node state: 1, unhealthy: 1"),
        (Request(9, gpu_models=[H100], exclude_nodes=["e"], min_cpu_milli_per_gpu=4000),
         "only 6 of 9 GPUs fit; excluded: gpu model: 1, node state: 1, unhealthy: 1, "
         "excluded node: 1"),
        (Request(1, gpu_models=[H100], min_cpu_milli_per_gpu=10_000, exclude_nodes=["d", "e"]),
         "only 0 of 1 GPUs fit; excluded: gpu model: 1, node state: 1, unhealthy: 1, "
         "excluded node: 2, free cpu: 1"),
        (Request(1, gpu_models=["B200"]), "only 0 of 1 GPUs fit; excluded: gpu model: 6"),
    ],
)
def test_refusal_counts_nodes_each_filter_excluded(request_, reason):
    placement = place_gang(LEVELS, NODES, request_)
    assert not placement.placed
    assert placement.reason == reason


def test_no_filter_excludes_anything_means_no_exclusion_note():
    nodes = [node("d", "l2", 4)]
    placement = place_gang(LEVELS, nodes, Request(5))
    assert placement.reason == "only 4 of 5 GPUs fit"
    assert placement.excluded == {}

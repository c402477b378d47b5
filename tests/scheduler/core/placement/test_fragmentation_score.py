"""FGD's fragmentation of a node against a mix of requests, worked by hand, and the node (and
GPU) a request goes to by it."""

from __future__ import annotations

import pytest

from scheduler.core.placement import InvalidInput, Node, PlacementIndex, Request
from scheduler.core.placement.fgd import (
    UNLIMITED,
    Demand,
    FragmentationScorer,
    NodeFree,
    RecentMix,
    node_fragmentation,
)

ROOMY = 1_000_000  # CPU milli and memory MiB that never run out


def free(*gpus: int, cpu: int = ROOMY, memory: int = ROOMY, model: str = "V100") -> NodeFree:
    return NodeFree(model, gpus, cpu, memory)


ONE_GPU = Demand(1, cpu_milli=4000)
HALF_GPU = Demand(1, 500, cpu_milli=2000)


def test_a_request_the_node_hosts_strands_only_the_gpus_too_small_for_it():
    # whole GPU: hosted, the 300 left on the third GPU is stranded; half GPU: hosted, same 300
    assert node_fragmentation(free(1000, 1000, 300), [ONE_GPU, HALF_GPU]) == 300


def test_a_request_the_node_lacks_cpu_for_strands_every_free_gpu():
    # 3,000 CPU: the whole GPU (4,000) strands all 2,300; the half GPU (2,000) has CPU for one
    # copy, which can use one GPU: the other 1,300 are stranded. Per request: (2300 + 1300) / 2.
    # The mix asks (4000 + 2000) / (1000 + 500) = 4 CPU per milli-GPU: 3,000 CPU back 750 of
    # the 2,300 free, so 1,550 more are short of CPU.
    node = free(1000, 1000, 300, cpu=3000)
    assert node_fragmentation(node, [ONE_GPU, HALF_GPU]) == (2300 + 1300) / 2 + 1550


def test_gpus_beyond_the_copies_the_cpu_backs_are_stranded():
    # 9,000 CPU back two one-GPU requests of 4,000: two of the four free GPUs are stranded;
    # at 4 CPU per milli-GPU the 9,000 back 2,250 of the 4,000 free: 1,750 short
    node = free(1000, 1000, 1000, 1000, cpu=9000)
    assert node_fragmentation(node, [ONE_GPU]) == 2000 + 1750


def test_the_cpu_shortfall_is_the_free_compute_the_cpu_cannot_back_at_the_mixs_ratio():
    scorer = FragmentationScorer([ONE_GPU, HALF_GPU])  # 4 CPU per milli-GPU
    assert scorer.cpu_shortfall(2000, 6000) == 500
    assert scorer.cpu_shortfall(2000, 8000) == 0
    assert scorer.cpu_shortfall(2000, UNLIMITED) == 0
    assert FragmentationScorer([Demand(1)]).cpu_shortfall(2000, 0) == 0  # the mix asks no CPU


def test_host_memory_counts_as_cpu_does():
    node = free(1000, 500, memory=16_384)
    assert node_fragmentation(node, [Demand(1, 500, memory_mib=32_768)]) == 1500
    assert node_fragmentation(node, [Demand(1, 500, memory_mib=8_192)]) == 0


def test_weights_average_the_stranded_compute():
    # 2-GPU pods cannot use one free GPU (all 1,000 stranded); a 600 share can (400 of the
    # second GPU is too small for it and stranded); weights 3 and 1
    node = free(1000, 400)
    mix = [Demand(2, weight=3), Demand(1, 600, weight=1)]
    assert node_fragmentation(node, mix) == pytest.approx((3 * 1400 + 1 * 400) / 4)


def test_cpu_only_tasks_and_other_gpu_models_strand_the_whole_node():
    node = free(1000, 250)
    assert node_fragmentation(node, [Demand(0, cpu_milli=8000)]) == 1250
    assert node_fragmentation(node, [Demand(1, 250, gpu_models=frozenset({"A100"}))]) == 1250


def test_a_node_with_nothing_free_is_not_fragmented():
    assert node_fragmentation(free(0, 0), [ONE_GPU]) == 0
    assert node_fragmentation(free(), [ONE_GPU]) == 0


def test_a_demand_that_is_no_request_is_refused():
    with pytest.raises(InvalidInput):
        Demand(2, 500)
    with pytest.raises(InvalidInput):
        Demand(1, 0)


def test_a_share_goes_where_it_leaves_room_for_the_next_share_not_to_the_tightest_gpu():
    scorer = FragmentationScorer([Demand(1, 400), Demand(1)])
    # before: n1 (1000, 700) strands (700 + 0) / 2 = 350; n2 (1000, 500) (500 + 0) / 2 = 250.
    # n1's 700 -> 400: (400 + 0) / 2 = 200, growth -150; n2's 500 -> 200: (200 + 200) / 2,
    # growth -50 (best fit's choice, 200 left); opening a whole GPU: +350 on either
    choice = scorer.choose([("n1", free(1000, 700)), ("n2", free(1000, 500))], Demand(1, 300))
    assert (choice.node, choice.gpu, choice.growth) == ("n1", 1, -150)


def test_a_one_gpu_job_keeps_a_two_gpu_hole_whole():
    scorer = FragmentationScorer([Demand(2)])
    # n2 is the tighter fit, but its last free GPU could then take no 2-GPU job (+1,000)
    choice = scorer.choose([("n8", free(*[1000] * 8)), ("n2", free(1000, 1000))], Demand(1))
    assert (choice.node, choice.growth) == ("n8", 0)


def test_a_job_leaves_the_cpu_the_mix_needs_beside_free_gpus():
    scorer = FragmentationScorer([Demand(1, cpu_milli=4000)])
    tight = free(1000, 1000, 1000, 1000, cpu=10_000)
    roomy = free(1000, 1000, 1000, 1000, cpu=64_000)
    # on `tight`, 2,000 CPU would be left: its 3 free GPUs could take no job of the mix
    choice = scorer.choose([("tight", tight), ("roomy", roomy)], Demand(1, cpu_milli=8000))
    assert choice.node == "roomy"


def test_a_cpu_heavy_share_goes_where_cpu_is_plentiful_before_a_whole_request_is_short():
    # mix: a whole GPU with 4,000 CPU, a half GPU with 1,000: 10/3 CPU per milli-GPU.
    # Per request, a half GPU with 2,000 CPU grows both nodes by 250 (on `lean` no CPU is
    # left for the whole GPU: 1,500 stranded, weight 1/2, from 1,000; on `rich` one whole GPU
    # still fits beside the share: the 500 left stranded), and best fit would take `lean`.
    # But `lean`'s CPU backs 1,200 of its 2,000 free milli-GPUs before and 600 of 1,500
    # after: 100 more short of CPU, so the share goes to `rich`, which stays backed.
    mix = [Demand(1, cpu_milli=4000), Demand(1, 500, cpu_milli=1000)]
    scorer = FragmentationScorer(mix)
    lean = free(1000, 1000, cpu=4000)
    rich = free(1000, 1000, cpu=8000)
    assert scorer.growth(lean, Demand(1, 500, cpu_milli=2000))[0] == pytest.approx(350)
    choice = scorer.choose([("lean", lean), ("rich", rich)], Demand(1, 500, cpu_milli=2000))
    assert (choice.node, choice.growth) == ("rich", pytest.approx(250))


def test_without_cpu_limits_the_measure_is_fgds():
    # nodes whose CPU and memory no lease holds (the market's): no copy limit, no shortfall
    node = free(1000, 1000, 300, cpu=UNLIMITED, memory=UNLIMITED)
    assert node_fragmentation(node, [ONE_GPU, HALF_GPU]) == 300


def test_equal_growth_is_broken_by_best_fit_then_by_order():
    scorer = FragmentationScorer([Demand(1)])
    nodes = [("a", free(1000, 1000, 1000)), ("b", free(1000, 1000)), ("c", free(1000, 1000))]
    assert scorer.choose(nodes, Demand(1)).node == "b"


def test_no_candidate_that_can_host_the_request_gives_none():
    scorer = FragmentationScorer([Demand(1)])
    assert scorer.choose([("a", free(600, cpu=1000))], Demand(1)) is None
    assert scorer.choose([("a", free(1000, cpu=1000))], Demand(1, cpu_milli=2000)) is None


def test_the_recent_mix_weighs_kinds_by_how_often_they_were_seen():
    recent = RecentMix(size=3)
    for demand in (Demand(8), Demand(1, 500), Demand(1, 500), Demand(1, 500)):
        recent.observe(demand)
    assert recent.mix() == (Demand(1, 500, weight=3.0),)  # the 8-GPU order fell out


# --- the engine's single-node choice against a mix (the market and the pools) ---------------


def test_with_a_mix_a_gpu_goes_where_a_four_gpu_request_still_fits_not_the_tightest_node():
    nodes = [Node("a", {"leaf": "l1"}, free_gpus=4, total_gpus=8),
             Node("b", {"leaf": "l1"}, free_gpus=5, total_gpus=8)]
    mix = (Demand(1, weight=0.5), Demand(4, weight=0.5))

    plain = PlacementIndex(["leaf", "node"], nodes).place(Request(gpus=1))
    fgd = PlacementIndex(["leaf", "node"], nodes).place(Request(gpus=1, mix=mix))

    # best fit takes the 4-free node and leaves 3 + 5; FGD leaves 4 + 4: both fit a 4-GPU job
    # (fragmentation: 3 free strand 3000 x 0.5 = 1500 against 4 free stranding none)
    assert plain.assignment == {"a": 1}
    assert fgd.assignment == {"b": 1}


def test_a_multi_node_request_keeps_its_locality_whatever_the_mix():
    nodes = [Node(f"n{i}", {"leaf": f"l{i // 2}"}, free_gpus=8) for i in range(4)]
    mix = (Demand(1, weight=1.0),)

    placed = PlacementIndex(["leaf", "node"], nodes).place(Request(gpus=16, mix=mix))

    assert len(placed.domains["leaf"]) == 1

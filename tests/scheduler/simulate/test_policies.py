"""Where each policy puts a job, and the resources every job must fit."""

from __future__ import annotations

import random

from scheduler.simulate.policies import (
    BestFit,
    FirstFit,
    RandomFit,
    demand_of,
    workload_demands,
    workload_mix,
)
from scheduler.simulate.state import ClusterState
from tests.scheduler.simulate.builders import cluster, job, node, two_leaves

EVERY_POLICY = (BestFit(workload_mix([job("any")])), FirstFit(), RandomFit(seed=1))


def busy(state: ClusterState, policy, *jobs):
    """Place and take each job in turn; the allocations, None for a refusal."""
    out = []
    for one in jobs:
        allocation = policy.place(state, one)
        out.append(None if allocation is None else state.take(allocation))
    return out


def test_best_fit_puts_a_job_on_the_node_it_fills_most_tightly():
    state = ClusterState(two_leaves())
    busy(state, FirstFit(), job("x", gpus=3), job("y", gpus=1), job("z", gpus=1))
    # free now: n1 1, n2 3, n3 4, n4 4 (first fit filled n1 then n2)
    [allocation] = busy(state, BestFit(()), job("a", gpus=3))
    assert allocation.whole == {"n2": 3}


def test_first_fit_takes_nodes_in_file_order_ignoring_topology():
    shuffled = cluster(node("n3", leaf="l2", spine="s"), node("n1", leaf="l1", spine="s"))
    state = ClusterState(shuffled)
    [allocation] = busy(state, FirstFit(), job("a", gpus=2))
    assert allocation.whole == {"n3": 2}


def test_random_is_the_same_for_the_same_seed():
    def choices(seed: int) -> list[str]:
        state = ClusterState(two_leaves())
        jobs = [job(f"j{i}", gpus=1) for i in range(6)]
        return [a.nodes[0] for a in busy(state, RandomFit(seed), *jobs)]

    assert choices(7) == choices(7)
    assert len({tuple(choices(seed)) for seed in range(5)}) > 1


def test_a_job_too_large_for_a_node_spans_the_fewest_leaves_with_best_fit():
    state = ClusterState(two_leaves())
    busy(state, FirstFit(), job("x", gpus=2))  # n1 has 2 free: leaf l1 holds 6, l2 holds 8
    [best] = busy(state, BestFit(()), job("a", gpus=8))
    assert sorted(best.whole) == ["n3", "n4"]  # all of leaf l2
    state = ClusterState(two_leaves())
    busy(state, FirstFit(), job("x", gpus=2))
    [first] = busy(state, FirstFit(), job("a", gpus=8))
    assert first.whole == {"n1": 2, "n2": 4, "n3": 2}  # across both leaves


def test_gpu_model_alternatives_are_honoured():
    mixed = cluster(node("a", model="A100"), node("h", model="H100"), node("v", model="V100"))
    for policy in EVERY_POLICY:
        state = ClusterState(mixed)
        [allocation] = busy(state, policy, job("j", gpus=4, models="V100|H100"))
        assert allocation.nodes[0] in {"h", "v"}, policy.name
        assert busy(state, policy, job("k", gpus=1, models="T4")) == [None]


def test_a_node_must_have_the_cpu_and_memory_for_the_gpus_it_gives():
    # n1 comes first and is as tight as n2, but has CPU for only 2 GPUs of this job.
    lean = cluster(node("n1", gpus=8, cpu=4_000), node("n2", gpus=8, cpu=16_000))
    for policy in EVERY_POLICY:
        state = ClusterState(lean)
        [allocation] = busy(state, policy, job("j", gpus=4, cpu=8_000))
        assert allocation.whole == {"n2": 4}, policy.name
        assert allocation.cpu == {"n2": 8_000}
        assert state.free_cpu["n2"] == 8_000


def test_memory_is_split_over_nodes_in_proportion_to_gpus():
    # 6 GPUs do not fit one 4-GPU node: 2 left on n1, 4 on n2, memory 2/6 and 4/6 of 6,000.
    state = ClusterState(cluster(node("n1", gpus=4), node("n2", gpus=4)))
    [allocation] = busy(state, FirstFit(), job("x", gpus=2), job("j", gpus=6, memory=6_000))[1:]
    assert allocation.whole == {"n1": 2, "n2": 4}
    assert allocation.memory == {"n1": 2_000, "n2": 4_000}


def test_a_job_without_gpus_does_not_strand_gpus_with_best_fit():
    # g1 has 8 GPUs and 8 CPUs; c1 has CPUs only and comes after it in the file.
    pair = cluster(node("g1", gpus=8, cpu=8_000), node("c1", gpus=0, cpu=8_000))
    cpu_job, gpu_job = job("cpu", gpus=0, cpu=8_000), job("gpu", gpus=8, cpu=4_000)
    state = ClusterState(pair)
    placed = busy(state, BestFit(()), cpu_job, gpu_job)
    assert placed[0].nodes == ["c1"] and placed[1].whole == {"g1": 8}
    state = ClusterState(pair)
    placed = busy(state, FirstFit(), cpu_job, gpu_job)
    assert placed[0].nodes == ["g1"] and placed[1] is None  # first fit took g1's CPUs


def test_shares_of_a_gpu_fill_an_open_gpu_before_opening_another():
    state = ClusterState(cluster(node("n1", gpus=2)))
    mix = workload_mix([job("s", gpus=1, milli=500)])
    placed = busy(state, BestFit(mix), job("a", gpus=1, milli=500), job("b", gpus=1, milli=500),
                  job("c", gpus=1, milli=500))
    slots = [allocation.shared.slot for allocation in placed]
    assert slots[0] == slots[1] != slots[2]
    assert state.index.free_gpus("n1") == 0 and state.allocated_milli == 1_500


def test_the_last_share_to_leave_gives_the_whole_gpu_back():
    state = ClusterState(cluster(node("n1", gpus=1)))
    a, b = busy(state, FirstFit(), job("a", gpus=1, milli=300), job("b", gpus=1, milli=300))
    assert state.index.free_gpus("n1") == 0
    state.give_back(a)
    assert state.index.free_gpus("n1") == 0
    state.give_back(b)
    assert state.index.free_gpus("n1") == 1 and state.allocated_milli == 0


def test_a_share_goes_where_fragmentation_grows_least():
    # Open GPUs with 500 and 300 thousandths free; the mix asks for 500 and 200 alike.
    # A 200 share on the 500 GPU leaves 300 (no longer fits a 500: fragmentation grows);
    # on the 300 GPU it leaves 100 (fits nothing, but 300 did not fit a 500 either: it grows
    # less). Both candidates are open; no GPU is opened.
    state = ClusterState(cluster(node("n1", gpus=3)))
    opened = busy(state, FirstFit(), job("a", gpus=1, milli=500), job("b", gpus=1, milli=700),
                  job("c", gpus=1, milli=1000))
    mix = workload_mix([job("x", gpus=1, milli=500), job("y", gpus=1, milli=200)])
    [allocation] = busy(state, BestFit(mix), job("s", gpus=1, milli=200))
    assert allocation.shared.slot == opened[1].shared.slot


def test_with_a_mix_best_fit_chooses_the_node_by_fragmentation():
    # two-GPU jobs make up the mix: a one-GPU job goes to the 4-GPU node, not the tighter
    # 2-GPU one whose last GPU would then be stranded
    state = ClusterState(cluster(node("small", gpus=2), node("big", gpus=4)))
    policy = BestFit((), workload_demands([job("pair", gpus=2)]))
    [allocation] = busy(state, policy, job("a", gpus=1))
    assert allocation.whole == {"big": 1}


def test_with_a_mix_a_multi_node_job_keeps_the_fewest_leaves():
    # fragmentation would rather break nothing, but the 8-GPU job still takes all of leaf l2
    state = ClusterState(two_leaves())
    busy(state, FirstFit(), job("x", gpus=2))
    policy = BestFit((), workload_demands([job("one", gpus=1), job("four", gpus=4)]))
    [allocation] = busy(state, policy, job("a", gpus=8))
    assert sorted(allocation.whole) == ["n3", "n4"]


def every_node_choice(policy: BestFit, state: ClusterState, one):
    """What the scorer chooses when it is shown every node, not one per group."""
    candidates = [(name, policy.node_free(state, name)[0]) for name in state.order
                  if one.gpus == 0 or state.model_ok(name, one)]
    return policy.scorer.choose(candidates, demand_of(one))


def test_scoring_one_node_per_group_chooses_what_scoring_every_node_would():
    # nodes of two models with uneven CPU, jobs of every kind arriving and leaving at random:
    # at every step the choice over the groups' first nodes is the choice over all nodes
    rng = random.Random(7)
    nodes = [node(f"n{i:02d}", gpus=rng.choice([2, 4, 8]), model=rng.choice(["A100", "V100"]),
                  cpu=rng.choice([16_000, 32_000, 64_000]), memory=256_000) for i in range(30)]
    state = ClusterState(cluster(*nodes))
    kinds = [dict(gpus=1), dict(gpus=2, cpu=8_000), dict(gpus=1, milli=300, cpu=2_000),
             dict(gpus=1, milli=500), dict(gpus=0, cpu=4_000), dict(gpus=4, models="V100")]
    policy = BestFit((), workload_demands([job("m", **kind) for kind in kinds]))
    running = []
    for step in range(400):
        if running and rng.random() < 0.4:
            state.give_back(running.pop(rng.randrange(len(running))))
            continue
        one = job(f"j{step}", **rng.choice(kinds))
        expected = every_node_choice(policy, state, one)
        allocation = policy.place(state, one)
        assert (allocation is None) == (expected is None)
        if allocation is not None:
            assert expected.node in {*allocation.whole, *allocation.cpu,
                                     *([allocation.shared.node] if allocation.shared else [])}
            running.append(state.take(allocation))
    assert len(running) > 20  # the cluster was busy, not empty, while the choices were checked


def test_gpus_held_back_from_a_policy_are_not_offered_by_the_fragmentation_scorer():
    state = ClusterState(cluster(node("n1", gpus=2), node("n2", gpus=4)))
    policy = BestFit((), workload_demands([job("pair", gpus=2)]))
    assert policy.place(state, job("warm", gpus=1)).whole == {"n2": 1}
    with state.withholding({"n2": 4}):
        assert policy.place(state, job("a", gpus=1)).whole == {"n1": 1}
    assert policy.place(state, job("b", gpus=1)).whole == {"n2": 1}

"""Replay: FIFO queue, EASY backfill, and the measures, on workloads worked out by hand."""

from __future__ import annotations

import random

import pytest

from scheduler.simulate.engine import Replay
from scheduler.simulate.policies import BestFit, FirstFit, make_policy, workload_mix
from tests.scheduler.simulate.builders import cluster, flat, job, node, two_leaves


def replay(cluster, jobs, policy=None, backfill_depth=100, samples=500,
           locality="pod") -> Replay:
    policy = policy or BestFit(workload_mix(jobs))
    return Replay(cluster, jobs, policy, backfill_depth=backfill_depth, samples=samples,
                  locality=locality).run()


def starts(result: Replay) -> dict[str, float]:
    return {record.job.name: record.start_s for record in result.finished}


def test_jobs_wait_in_arrival_order_until_gpus_are_free():
    # One node of 4 GPUs. a holds all 4 until 10; b (2 GPUs) is next in line and starts at
    # 10; c (2 GPUs) arrived later and fits beside b, also at 10.
    jobs = [job("a", 0, 10, gpus=4), job("b", 0, 5, gpus=2), job("c", 1, 2, gpus=2)]
    result = replay(flat(1, gpus=4), jobs)
    assert starts(result) == {"a": 0, "b": 10, "c": 10}


def test_waits_completion_times_and_utilisation_of_a_small_replay():
    jobs = [job("a", 0, 10, gpus=4), job("b", 0, 5, gpus=2), job("c", 1, 2, gpus=2)]
    out = replay(flat(1, gpus=4), jobs).results()
    # waits: a 0, b 10, c 9 -> mean 19/3; p50 9; p95 between 9 and 10 at 0.9 -> 9.9
    assert out["wait_s"]["mean"] == pytest.approx(19 / 3)
    assert out["wait_s"]["p50"] == 9
    assert out["wait_s"]["p95"] == pytest.approx(9.9)
    # completion: a 10, b 15, c 12 - 1 = 11 -> mean 12
    assert out["jct_s"]["mean"] == pytest.approx(12)
    # busy 4*10 + 2*5 + 2*2 = 54 GPU-s over 4 GPUs x 15 s = 60
    assert out["utilization"] == pytest.approx(0.9)
    assert out["span_s"] == 15


def test_a_later_job_does_not_pass_a_blocked_head_without_backfill():
    jobs = [job("a", 0, 10, gpus=2), job("b", 1, 5, gpus=4), job("c", 2, 3, gpus=2)]
    result = replay(flat(1, gpus=4), jobs, backfill_depth=0)
    assert starts(result) == {"a": 0, "b": 10, "c": 15}


def test_backfill_starts_a_small_job_that_does_not_delay_the_head():
    # b needs the whole node and can start when a ends at 10; c ends at 5, before that.
    jobs = [job("a", 0, 10, gpus=2), job("b", 1, 5, gpus=4), job("c", 2, 3, gpus=2)]
    result = replay(flat(1, gpus=4), jobs)
    assert starts(result) == {"a": 0, "b": 10, "c": 2}


def test_backfill_refuses_a_job_that_would_delay_the_head():
    # At 6, d would fit on the 2 free GPUs but run past 10, when b needs all 4.
    jobs = [job("a", 0, 10, gpus=2), job("b", 1, 5, gpus=4), job("d", 6, 20, gpus=1)]
    result = replay(flat(1, gpus=4), jobs)
    assert starts(result) == {"a": 0, "b": 10, "d": 15}


def test_backfill_lets_a_long_job_take_gpus_the_head_will_not_need():
    # 8 GPUs: a holds 6 until 10; b needs 4 and will have 8 free at 10, so 4 are spare then.
    # c runs long but takes 2 of those spare GPUs, so it starts at once; b still starts at 10.
    jobs = [job("a", 0, 10, gpus=6), job("b", 1, 5, gpus=4), job("c", 2, 100, gpus=2)]
    result = replay(flat(1, gpus=8), jobs)
    assert starts(result) == {"a": 0, "b": 10, "c": 2}


def test_backfill_counts_down_the_spare_gpus_as_it_starts_long_jobs():
    jobs = [job("a", 0, 10, gpus=5), job("b", 1, 5, gpus=5), job("c", 2, 100, gpus=2),
            job("d", 3, 100, gpus=1)]
    # at 10, 8 free minus b's 5 leaves 3 spare: c takes 2, d takes the last 1
    result = replay(flat(1, gpus=8), jobs)
    assert starts(result) == {"a": 0, "b": 10, "c": 2, "d": 3}
    late = [job("a", 0, 10, gpus=5), job("b", 1, 5, gpus=5), job("c", 2, 100, gpus=2),
            job("d", 3, 100, gpus=1), job("e", 3, 100, gpus=1)]
    # e would need a fourth spare GPU: it waits for b to end at 15
    assert starts(replay(flat(1, gpus=8), late))["e"] == 15


def test_backfill_looks_only_at_the_first_jobs_behind_the_head():
    jobs = [job("a", 0, 10, gpus=2), job("b", 1, 5, gpus=4), job("c", 2, 30, gpus=2),
            job("d", 2, 3, gpus=2)]
    # c may not backfill (runs past 10); with a depth of 1, d behind it is never looked at
    assert starts(replay(flat(1, gpus=4), jobs, backfill_depth=1))["d"] == 15
    assert starts(replay(flat(1, gpus=4), jobs, backfill_depth=2))["d"] == 2


def test_a_job_larger_than_the_cluster_is_refused_not_queued_forever():
    jobs = [job("huge", 0, 10, gpus=9), job("small", 1, 10, gpus=1)]
    out = replay(flat(2, gpus=4), jobs).results()
    assert out["jobs"] == {"total": 2, "completed": 1, "refused": 1}


def test_a_job_without_gpus_runs_beside_gpu_jobs():
    jobs = [job("gpu", 0, 10, gpus=4), job("cpu", 0, 10, gpus=0, cpu=1000)]
    out = replay(flat(1, gpus=4), jobs).results()
    assert out["wait_s"]["mean"] == 0
    assert out["utilization"] == 1.0  # the CPU-only job adds no GPU time


def test_fragmentation_is_sampled_over_time():
    # Two nodes of 4 GPUs; a 2-GPU job holds half of one node from 0 to 10. While it runs,
    # 6 GPUs are free and 4 of them on a wholly free node: fragmentation 1 - 4/6 = 1/3.
    # The last job ends at 30; six samples, one every 5 s.
    out = replay(flat(2, gpus=4), [job("a", 0, 10, gpus=2), job("b", 20, 10, gpus=1)],
                 samples=6)
    series = dict((t, f) for t, f in out.results()["fragmentation"]["series"])
    assert series[5.0] == pytest.approx(1 / 3)
    assert series[15.0] == 0  # nothing runs: every free GPU is on a wholly free node


def test_first_fit_and_best_fit_see_the_same_queue():
    jobs = [job("a", 0, 10, gpus=4), job("b", 0, 5, gpus=2), job("c", 1, 2, gpus=2)]
    assert starts(replay(flat(1, gpus=4), jobs, FirstFit())) == {"a": 0, "b": 10, "c": 10}


def test_a_job_that_fits_one_node_waits_for_one_node_to_free_up():
    # Two nodes of 4 GPUs; a and b hold 3 on each until 10. Two GPUs are free at 1, one on
    # each node: c (2 GPUs) must wait for a node, unless the relaxed rule lets it span both.
    jobs = [job("a", 0, 10, gpus=3), job("b", 0, 10, gpus=3), job("c", 1, 5, gpus=2)]
    assert starts(replay(flat(2, gpus=4), jobs)) == {"a": 0, "b": 0, "c": 10}
    assert starts(replay(flat(2, gpus=4), jobs, locality="relaxed"))["c"] == 1


def test_backfill_keeps_off_the_node_reserved_for_a_single_node_head():
    # n1: a holds 3 of 4 GPUs until 10; n2: b holds 2 of 4 until 20. c needs 4 on one node:
    # n1 is reserved for it at 10. d (1 GPU, long) may not take n1's free GPU, but may take
    # one of n2's.
    jobs = [job("a", 0, 10, gpus=3), job("b", 0, 20, gpus=2), job("c", 1, 5, gpus=4),
            job("d", 2, 100, gpus=1)]
    result = replay(flat(2, gpus=4), jobs)
    assert starts(result) == {"a": 0, "b": 0, "c": 10, "d": 2}
    d = next(record for record in result.finished if record.job.name == "d")
    assert d.allocation.nodes == ["n2"]


def test_locality_of_a_replay_shows_where_first_fit_spreads_a_large_job():
    # Two leaves of two 4-GPU nodes. x (2 GPUs) runs on n1; then a job of 8 GPUs arrives.
    # Best fit puts it on leaf l2 whole (1 leaf, minimal); first fit takes n1's 2 free GPUs,
    # n2 and half of n3 (2 leaves, not minimal).
    jobs = [job("x", 0, 100, gpus=2), job("big", 1, 10, gpus=8)]
    best = replay(two_leaves(), jobs).results()["locality"]
    first = replay(two_leaves(), jobs, FirstFit()).results()["locality"]
    assert (best["minimal_domain_share"], best["mean_leaves_multi_node"]) == (1.0, 1.0)
    assert (first["minimal_domain_share"], first["mean_leaves_multi_node"]) == (0.5, 2.0)


@pytest.mark.parametrize("policy_name", ["best_fit", "first_fit", "random"])
def test_a_mixed_replay_starts_no_job_early_and_gives_everything_back(policy_name):
    # 300 seeded jobs of every kind on a small, mixed cluster; taking more than a node has
    # raises inside the simulation, so finishing is itself the check that nothing overflowed.
    rng = random.Random(9)
    mixed = cluster(node("n1", gpus=4, leaf="l1", spine="s", cpu=16_000),
                    node("n2", gpus=8, leaf="l1", spine="s", model="H100", cpu=32_000),
                    node("n3", gpus=4, leaf="l2", spine="s", cpu=16_000),
                    node("c1", gpus=0, leaf="l2", spine="s", cpu=32_000))
    jobs = []
    for i in range(300):
        kind = rng.choice(["whole", "share", "cpu", "large", "model"])
        jobs.append(job(f"j{i}", submit=rng.randint(0, 500), duration=rng.randint(0, 60),
                        gpus={"whole": rng.choice([1, 2, 4]), "share": 1, "cpu": 0,
                              "large": 12, "model": 2}[kind],
                        milli=rng.choice([100, 250, 500]) if kind == "share" else 1000,
                        models="H100" if kind == "model" else "",
                        cpu=rng.choice([0, 1000, 4000])))
    result = replay(mixed, jobs, make_policy(policy_name, 1, jobs))
    assert all(r.start_s >= r.job.submit_s for r in result.finished)
    out = result.results()
    assert out["jobs"]["completed"] + out["jobs"]["refused"] == 300
    state = result.state
    assert state.allocated_milli == 0 and state.free_whole() == 16
    assert state.free_cpu == {"n1": 16_000, "n2": 32_000, "n3": 16_000, "c1": 32_000}
    assert 0 < out["utilization"] <= 1


@pytest.mark.parametrize("locality", ["pod", "relaxed"])
@pytest.mark.parametrize("seed", range(6))
def test_backfill_never_starts_a_head_later_than_first_promised(seed, locality):
    # Whole-GPU jobs with exact durations: EASY backfill's promise holds exactly.
    rng = random.Random(seed)
    jobs = [job(f"j{i}", submit=rng.randint(0, 200), duration=rng.randint(1, 50),
                gpus=rng.choice([1, 1, 2, 3, 4, 6, 8])) for i in range(120)]
    result = replay(flat(3, gpus=4), jobs, locality=locality)
    assert result.promised_start  # heads were blocked, and backfill had work to do
    started = {record.job.position: record.start_s for record in result.finished}
    for position, promised in result.promised_start.items():
        assert started[position] <= promised


def two_leaves_of_two_models() -> object:
    """l1: n1 (X), n2 (X); l2: n3 (Y), n4 (Y); 4 GPUs each."""
    return cluster(node("n1", leaf="l1", spine="s", model="X"),
                   node("n2", leaf="l1", spine="s", model="X"),
                   node("n3", leaf="l2", spine="s", model="Y"),
                   node("n4", leaf="l2", spine="s", model="Y"))


def test_a_job_spanning_nodes_waits_for_a_compact_shape_when_asked_to():
    # a holds n1 until 10 and b n3 until 20; at 1, c's 8 GPUs are free only as n2 + n4,
    # two leaves where one would do. Held (slack 0), it starts at 10 on leaf l1 whole.
    def jobs():
        return [job("a", 0, 10, gpus=4, models="X"), job("b", 0, 20, gpus=4, models="Y"),
                job("c", 1, 5, gpus=8, models="X|Y")]
    spread = replay(two_leaves_of_two_models(), jobs())
    held = Replay(two_leaves_of_two_models(), jobs(), BestFit(workload_mix(jobs())),
                  compact_slack=0, compact_patience_s=100).run()

    assert starts(spread)["c"] == 1
    assert starts(held)["c"] == 10
    c = next(r for r in held.finished if r.job.name == "c")
    assert sorted(c.allocation.whole) == ["n1", "n2"]


def test_a_job_held_for_a_compact_shape_starts_anyway_once_its_patience_is_spent():
    jobs = [job("a", 0, 10, gpus=4, models="X"), job("b", 0, 20, gpus=4, models="Y"),
            job("c", 1, 5, gpus=8, models="X|Y"), job("d", 3, 1, gpus=0, cpu=1)]
    held = Replay(two_leaves_of_two_models(), jobs, BestFit(workload_mix(jobs)),
                  compact_slack=0, compact_patience_s=2).run()

    # held from 1, when it could first start spread; at 3 (d's arrival, the next event)
    # it has been held 2 s: it takes the spread shape
    assert starts(held)["c"] == 3


def test_a_held_job_keeps_only_the_leaf_it_waits_for_and_others_run_on_the_rest():
    # c is held for leaf l1 (whole at 10, when a ends); d, long, arrives at 2: it may not
    # take n2 (l1) but runs at once on n4 (l2), and c still starts at 10 on l1
    jobs = [job("a", 0, 10, gpus=4, models="X"), job("b", 0, 20, gpus=4, models="Y"),
            job("c", 1, 5, gpus=8, models="X|Y"), job("d", 2, 100, gpus=4, models="X|Y")]
    held = Replay(two_leaves_of_two_models(), jobs, BestFit(workload_mix(jobs)),
                  compact_slack=0, compact_patience_s=100).run()

    assert starts(held)["c"] == 10 and starts(held)["d"] == 2
    placed = {r.job.name: sorted(r.allocation.whole) for r in held.finished}
    assert placed["c"] == ["n1", "n2"] and placed["d"] == ["n4"]

"""Fill: jobs drawn with replacement, placed at once or refused, nothing leaves."""

from __future__ import annotations

import pytest

from scheduler.simulate.fill import fill
from scheduler.simulate.policies import BestFit, FirstFit
from tests.scheduler.simulate.builders import flat, job


def test_allocation_ratio_at_each_fill_fraction():
    # Two nodes of 4 GPUs; every draw is the same 3-GPU job. Asked 3 (< 4), then 6: both
    # placed, one per node: 6 of 8 allocated at 0.5. Then asked 9 and 12 (up to 1.3 x 8 =
    # 10.4): refused, only one GPU free per node.
    out = fill(flat(2, gpus=4), [job("j", gpus=3)], FirstFit(), [0.5, 1.0, 1.3], seed=1)
    assert out[0.5]["allocation_ratio"] == 0.75
    assert out[0.5]["asked_gpus"] == 6
    assert out[1.0]["allocation_ratio"] == 0.75 and out[1.0]["asked_gpus"] == 9
    assert out[1.3]["jobs_drawn"] == 4 and out[1.3]["jobs_refused"] == 2


def test_shares_count_in_thousandths():
    # One node of 2 GPUs, shares of 600: two fit (one per GPU), then every draw is refused.
    out = fill(flat(1, gpus=2), [job("s", gpus=1, milli=600)], FirstFit(), [1.0], seed=3)
    assert out[1.0]["allocation_ratio"] == pytest.approx(0.6)
    assert out[1.0]["asked_gpus"] == pytest.approx(2.4)


def test_the_draws_are_the_same_for_every_policy_with_one_seed():
    jobs = [job("a", gpus=1), job("b", gpus=2), job("c", gpus=4)]
    first = fill(flat(4, gpus=4), jobs, FirstFit(), [0.9], seed=5)[0.9]
    best = fill(flat(4, gpus=4), jobs, BestFit(()), [0.9], seed=5)[0.9]
    assert first["asked_gpus"] == best["asked_gpus"] and first["jobs_drawn"] == best["jobs_drawn"]


def test_best_fit_keeps_whole_nodes_free_for_large_jobs_where_first_fit_cannot():
    # Drawn from 1-GPU and 4-GPU jobs on four 4-GPU nodes; best fit packs the small ones.
    jobs = [job("one", gpus=1), job("four", gpus=4)]
    best = fill(flat(4, gpus=4), jobs, BestFit(()), [1.3], seed=11)[1.3]
    worst = fill(flat(4, gpus=4), jobs, FirstFit(), [1.3], seed=11)[1.3]
    assert best["allocation_ratio"] >= worst["allocation_ratio"]


def test_a_workload_without_gpu_jobs_is_refused():
    with pytest.raises(ValueError, match="asks for no GPUs"):
        fill(flat(1), [job("cpu", gpus=0, cpu=100)], FirstFit(), [1.0], seed=1)

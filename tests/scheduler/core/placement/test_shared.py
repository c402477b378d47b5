"""Shared GPUs: fragmentation-aware choice versus the best-fit baseline."""

import random

import pytest

from scheduler.core.placement import (
    DEFAULT_MIX,
    InvalidInput,
    MixItem,
    SharedGpu,
    SharedRequest,
    choose_shared_gpu,
    fragmentation,
)
from scheduler.core.placement.shared import best_fit_shared_gpu

HALVES_AND_QUARTERS = (MixItem(500, 0, 1.0), MixItem(250, 0, 1.0))


@pytest.mark.parametrize(
    "free_milli, free_memory, mix, expected",
    [
        (1000, 40_000, DEFAULT_MIX, 0.0),  # every request fits a free GPU
        (100, 40_000, DEFAULT_MIX, 100.0),  # nothing in the mix fits 100 milli
        (300, 40_000, HALVES_AND_QUARTERS, 150.0),  # the half cannot use it: 300 x 1/2
        (600, 0, (MixItem(500, 1, 1.0),), 600.0),  # compute is free but no memory
    ],
)
def test_fragmentation_is_the_free_compute_the_mix_cannot_use(
    free_milli, free_memory, mix, expected
):
    assert fragmentation(free_milli, free_memory, mix) == expected


def test_keeps_room_for_a_half_gpu_where_best_fit_would_not():
    # best fit puts 100 on the 550 GPU, leaving 450: no half GPU fits there any more.
    # taking it from the 600 GPU leaves 500 and 550: two halves still fit.
    gpus = [SharedGpu("x", 600, 40_000), SharedGpu("y", 550, 40_000)]
    request = SharedRequest(gpu_milli=100, memory_mib=1_000)
    assert best_fit_shared_gpu(gpus, request) == "y"
    assert choose_shared_gpu(gpus, request, HALVES_AND_QUARTERS) == "x"


def test_breaks_ties_by_best_fit_then_id():
    gpus = [SharedGpu("b", 1000, 40_000), SharedGpu("a", 1000, 40_000),
            SharedGpu("c", 700, 40_000)]
    # every choice strands nothing for a mix of small requests: best fit (c) wins
    assert choose_shared_gpu(gpus, SharedRequest(100, 0), (MixItem(100, 0, 1.0),)) == "c"
    assert choose_shared_gpu(gpus[:2], SharedRequest(100, 0), (MixItem(100, 0, 1.0),)) == "a"


def test_no_gpu_with_room_means_none():
    gpus = [SharedGpu("x", 200, 40_000), SharedGpu("y", 900, 500)]
    assert choose_shared_gpu(gpus, SharedRequest(300, 1_000)) is None


@pytest.mark.parametrize("milli", [0, 1000, -1])
def test_fraction_must_be_1_to_999_milli(milli):
    with pytest.raises(InvalidInput) as error:
        SharedRequest(gpu_milli=milli, memory_mib=0)
    assert error.value.field == "gpu_milli"


def churn(chooser, seed, gpu_count=40, steps=2000, target_load=0.6):
    """Fractional arrivals and departures around a target load; the pool's fragmentation,
    averaged over samples after a warm-up so one unlucky moment does not decide."""
    rng = random.Random(seed)
    fractional = [item for item in DEFAULT_MIX if item.gpu_milli < 1000]
    free = {f"g{i:02d}": [1000, 40_960] for i in range(gpu_count)}
    live: list[tuple[str, int, int]] = []
    used = 0
    samples = []
    for step in range(steps):
        if step >= steps // 4 and step % 10 == 0:
            samples.append(sum(fragmentation(m, mem, DEFAULT_MIX) for m, mem in free.values()))
        if live and (used > target_load * gpu_count * 1000 or rng.random() < 0.3):
            gpu, milli, memory = live.pop(rng.randrange(len(live)))
            free[gpu][0] += milli
            free[gpu][1] += memory
            used -= milli
            continue
        item = rng.choices(fractional, weights=[i.weight for i in fractional])[0]
        gpus = [SharedGpu(gpu, milli, memory) for gpu, (milli, memory) in free.items()]
        gpu = chooser(gpus, SharedRequest(item.gpu_milli, item.memory_mib))
        if gpu is not None:
            free[gpu][0] -= item.gpu_milli
            free[gpu][1] -= item.memory_mib
            used += item.gpu_milli
            live.append((gpu, item.gpu_milli, item.memory_mib))
    return sum(samples) / len(samples)


def test_under_churn_fragmentation_stays_below_best_fit():
    # Fixed seeds; one run can go either way, over six the fragmentation-aware choice strands
    # about 5 % less free compute than best fit (measured 0.954 of it when written).
    ours = sum(churn(choose_shared_gpu, seed) for seed in range(6))
    baseline = sum(churn(best_fit_shared_gpu, seed) for seed in range(6))
    assert ours < 0.97 * baseline

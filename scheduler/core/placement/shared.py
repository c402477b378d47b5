"""Shared GPUs: choosing the physical GPU for a fractional request (`gpu_milli` 1..999).

Best fit (the GPU left with the least free) strands slivers that nothing can use. Instead we
measure a GPU's *fragmentation* against the expected mix of requests: the free compute that a
request drawn from the mix could not use, averaged over the mix by weight (after "Beware of
Fragmentation", Weng et al., USENIX ATC '23). We choose the GPU whose fragmentation grows
least, so the pool stays able to take whole-GPU and large fractional requests; best fit
breaks ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from market.core.whatif import InvalidInput

WHOLE_GPU_MILLI = 1000


@dataclass(frozen=True)
class SharedGpu:
    id: str
    free_milli: int
    free_memory_mib: int


@dataclass(frozen=True)
class SharedRequest:
    gpu_milli: int
    memory_mib: int

    def __post_init__(self) -> None:
        if not 1 <= self.gpu_milli <= 999:
            raise InvalidInput("gpu_milli", "must be between 1 and 999")
        if self.memory_mib < 0:
            raise InvalidInput("memory_mib", "must not be negative")


@dataclass(frozen=True)
class MixItem:
    """One kind of request expected in the pool, with its share of arrivals."""

    gpu_milli: int
    memory_mib: int
    weight: float


# A whole GPU needs a wholly free GPU, so its memory demand is expressed through gpu_milli.
DEFAULT_MIX: tuple[MixItem, ...] = (
    MixItem(1000, 0, 0.3),
    MixItem(500, 20_000, 0.2),
    MixItem(250, 10_000, 0.25),
    MixItem(125, 5_000, 0.25),
)


def fits(free_milli: int, free_memory_mib: int, gpu_milli: int, memory_mib: int) -> bool:
    return gpu_milli <= free_milli and memory_mib <= free_memory_mib


def fragmentation(free_milli: int, free_memory_mib: int, mix: Sequence[MixItem]) -> float:
    """Expected free compute (milli-GPUs) on one GPU that a request from `mix` cannot use."""
    total = sum(item.weight for item in mix)
    stranded = sum(
        item.weight
        for item in mix
        if not fits(free_milli, free_memory_mib, item.gpu_milli, item.memory_mib)
    )
    return free_milli * stranded / total if total else 0.0


def choose_shared_gpu(
    gpus: Sequence[SharedGpu], request: SharedRequest, mix: Sequence[MixItem] = DEFAULT_MIX
) -> str | None:
    """The id of the GPU to share, or None when no GPU has room."""
    best_id: str | None = None
    best_key: tuple[float, int, str] | None = None
    for gpu in gpus:
        if not fits(gpu.free_milli, gpu.free_memory_mib, request.gpu_milli, request.memory_mib):
            continue
        after_milli = gpu.free_milli - request.gpu_milli
        after_memory = gpu.free_memory_mib - request.memory_mib
        growth = fragmentation(after_milli, after_memory, mix) - fragmentation(
            gpu.free_milli, gpu.free_memory_mib, mix
        )
        key = (round(growth, 9), after_milli, gpu.id)
        if best_key is None or key < best_key:
            best_id, best_key = gpu.id, key
    return best_id


def best_fit_shared_gpu(gpus: Sequence[SharedGpu], request: SharedRequest) -> str | None:
    """The baseline: the GPU left with the least free compute."""
    roomy = [
        gpu
        for gpu in gpus
        if fits(gpu.free_milli, gpu.free_memory_mib, request.gpu_milli, request.memory_mib)
    ]
    if not roomy:
        return None
    return min(roomy, key=lambda gpu: (gpu.free_milli - request.gpu_milli, gpu.id)).id

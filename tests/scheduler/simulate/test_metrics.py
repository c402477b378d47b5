"""The locality and summary measures, on placements written out by hand."""

from __future__ import annotations

import pytest

from scheduler.simulate.metrics import locality, percentile
from scheduler.simulate.state import ClusterState
from tests.scheduler.simulate.builders import flat, job, two_leaves


def test_locality_counts_jobs_inside_the_smallest_domain_that_could_hold_them():
    placed = [
        (job("a", gpus=4), ["n1"]),  # a node could hold 4: placed on one node, minimal
        (job("b", gpus=4), ["n1", "n2"]),  # could have been one node: not minimal, 1 leaf
        (job("c", gpus=8), ["n2", "n3"]),  # a leaf could hold 8: spans two, 2 leaves
        (job("d", gpus=8), ["n3", "n4"]),  # one leaf: minimal, 1 leaf
        (job("e", gpus=1), ["n4"]),  # one GPU: not a multi-GPU job
    ]
    out = locality(two_leaves(), placed)
    assert out["minimal_domain_share"] == pytest.approx(2 / 4)
    assert out["mean_leaves_multi_node"] == pytest.approx((1 + 2 + 1) / 3)
    assert out["multi_gpu_jobs"] == 4 and out["multi_node_jobs"] == 3


def test_locality_is_undefined_without_multi_gpu_jobs():
    out = locality(two_leaves(), [(job("a", gpus=1), ["n1"])])
    assert out["minimal_domain_share"] is None and out["mean_leaves_multi_node"] is None


def test_percentiles_interpolate_between_ranks():
    assert percentile([0, 10, 20], 0.5) == 10
    assert percentile([20, 0, 10], 0.95) == pytest.approx(19)
    assert percentile([], 0.5) is None


def test_fragmentation_is_the_free_share_off_wholly_free_nodes():
    state = ClusterState(flat(2, gpus=4))
    assert state.fragmentation() == 0
    state.index.commit({"n1": 2})  # 6 free, 4 on the wholly free n2
    assert state.fragmentation() == pytest.approx(1 / 3)
    state.index.commit({"n2": 4})  # 2 free, none on a wholly free node
    assert state.fragmentation() == 1

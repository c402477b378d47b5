"""The pure parts of bench/slurm_peer.py: job shapes from the trace, the stream, leaf metrics.

The Slurm side of the bench needs root and a real slurmctld; these need neither.
"""

import pytest

from bench.slurm_peer import (
    Job,
    draw_stream,
    ends_by_position,
    engine_request,
    fewest_leaves,
    job_shape,
    leaf_metrics,
    offered_gpus,
    salloc_args,
)


@pytest.mark.parametrize(("asked", "shape"), [
    (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (7, 8), (8, 8),
    (9, 16), (12, 16), (16, 16), (17, 24), (24, 24), (128, 128),
])
def test_a_trace_size_rounds_up_to_a_single_node_shape_or_whole_nodes(asked, shape):
    assert job_shape(asked) == shape


def test_a_job_without_gpus_is_not_a_shape():
    with pytest.raises(ValueError):
        job_shape(0)


def test_both_sides_ask_for_the_same_shape():
    assert salloc_args(4)[-2:] == ["--nodes=1", "--gres=gpu:4"]
    assert salloc_args(24)[-2:] == ["--nodes=3", "--gres=gpu:8"]
    assert "--immediate" in salloc_args(4) and "--no-shell" in salloc_args(4)
    single, whole = engine_request(4), engine_request(24)
    assert (single.gpus, single.required, single.slice) == (4, "node", None)
    assert (whole.gpus, whole.preferred, whole.slice.size, whole.slice.level) == (
        24, "leaf", 8, "node")


@pytest.mark.parametrize(("nodes", "leaf_size", "fewest"), [
    (2, 16, 1), (16, 16, 1), (17, 16, 2), (32, 16, 2), (9, 8, 2)])
def test_the_fewest_leaves_a_job_can_span_is_its_nodes_over_the_leaf_size_rounded_up(
        nodes, leaf_size, fewest):
    assert fewest_leaves(nodes, leaf_size) == fewest


def test_leaf_metrics_count_leaves_per_job_and_the_share_on_the_fewest():
    leaf_of = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "c1": "C"}
    one_leaf = ["a1", "a2"]              # 1 leaf, fewest 1
    split = ["a3", "b1"]                 # 2 leaves, fewest 1
    three_on_two = ["a1", "a2", "b1"]    # 2 leaves (leaf size 2: fewest 2)
    mean, share = leaf_metrics([one_leaf, split, three_on_two], leaf_of, leaf_size=2)
    assert mean == pytest.approx(5 / 3)
    assert share == pytest.approx(2 / 3)


def test_leaf_metrics_of_no_multi_node_job_are_none():
    assert leaf_metrics([], {}, 16) == (None, None)


ROWS = [(1, 60.0), (2, 600.0), (8, 3600.0), (16, 36_000.0), (3, 10.0)]


def test_a_stream_is_the_same_for_the_same_seed_and_no_job_ends_without_a_load():
    stream = draw_stream(ROWS, 200, seed=7)
    assert stream == draw_stream(ROWS, 200, seed=7)
    assert {job.shape for job in stream} <= {1, 2, 8, 16, 4}
    assert all(job.end is None for job in stream)
    assert ends_by_position(stream) == {}


def test_with_a_load_every_job_ends_after_it_arrives_and_the_stream_holds_that_load():
    stream = draw_stream(ROWS, 400, seed=7, load=1.0, gpus=64)
    assert all(job.end is not None and job.end > position
               for position, job in enumerate(stream))
    assert offered_gpus(stream) == pytest.approx(64, rel=0.1)
    for position, ended in ends_by_position(stream).items():
        assert all(stream[e].end == position and e < position for e in ended)


def test_offered_gpus_average_what_is_held_over_the_second_half():
    # two jobs of 8 GPUs; the first ends before position 2, the second never
    stream = [Job(8, end=2), Job(8), Job(1, end=3), Job(1, end=4)]
    # held at positions 2 and 3: 8 + 1 (job 2 starts at 2), then 8 + 1 (job 3 replaces job 2)
    assert offered_gpus(stream) == 9

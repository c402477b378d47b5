"""The part placer and the part defragmenter on hand-built GPUs."""

import pytest

from market.core.parts import PartGpu, PartRequest, share_price_micros, slice_price_micros
from scheduler.core.placement import InvalidInput
from scheduler.core.placement.parts import HeldPart, choose_parts, free_runs, plan_part_moves

MODEL = "H100-80GB"


def gpu(gid, node="n1", index=None, slices=(), shares=(), price=100, name=None):
    return PartGpu(id=gid, node=node, index=gid if index is None else index, model=MODEL,
                   memory_mib=80_000, slices=tuple(slices), shares=tuple(shares),
                   part_prices={name or "share": price, "1g.10gb": price, "3g.40gb": price,
                                "4g.40gb": price, "2g.20gb": price})


def share(size, count=1, limit=None):
    return PartRequest(count=count, share=size, max_price_micros=limit)


def mig(profile, count=1):
    return PartRequest(count=count, mig_profile=profile)


def test_a_share_goes_to_the_gpu_already_shared_not_a_whole_one():
    placed = choose_parts([gpu(1), gpu(2, shares=[(0, 500)])], share(250))

    assert placed.placed and [(p.gpu_id, p.span) for p in placed.parts] == [(2, (500, 750))]


def test_a_share_takes_the_narrowest_free_run_that_holds_it():
    assert free_runs([(0, 100), (300, 800)]) == [(100, 300), (800, 1000)]

    placed = choose_parts([gpu(1, shares=[(0, 100), (300, 800)])], share(150))

    assert placed.parts[0].span == (100, 250)


def test_the_cheapest_part_wins_over_a_tidier_one():
    placed = choose_parts([gpu(1, price=90), gpu(2, shares=[(0, 500)], price=100)], share(250))

    assert placed.parts[0].gpu_id == 1


def test_shares_and_slices_never_mix_on_one_gpu():
    with_slice = gpu(1, slices=[("1g.10gb", 0)])
    with_share = gpu(2, shares=[(0, 100)])

    assert choose_parts([with_slice], share(100)).placed is False
    assert choose_parts([with_share], mig("1g.10gb")).placed is False
    assert choose_parts([with_slice, with_share], mig("1g.10gb")).parts[0].gpu_id == 1


def test_a_slice_takes_a_legal_start_beside_the_slices_there():
    placed = choose_parts([gpu(1, slices=[("1g.10gb", 0)])], mig("3g.40gb"))

    [part] = placed.parts
    assert (part.start, part.span, part.mig_profile) == (4, (500, 1000), "3g.40gb")
    assert part.agent_json() == {"index": 1, "mig_profile": "3g.40gb", "start": 4}


def test_a_slice_with_no_legal_start_free_is_refused_saying_so():
    placed = choose_parts([gpu(1, slices=[("1g.10gb", 0)])], mig("4g.40gb"))

    assert placed.placed is False
    assert placed.reason == "no legal position for 4g.40gb (starts 0) is free on 1 GPU"


def test_an_orders_parts_are_on_one_node():
    gpus = [gpu(1, node="a"), gpu(2, node="b"), gpu(3, node="b", index=1)]

    placed = choose_parts(gpus, share(500, count=2))

    assert placed.node == "b" and sorted(p.gpu_id for p in placed.parts) == [2, 3]
    assert choose_parts(gpus, share(500, count=3)).reason == (
        "no node has 3 GPUs with room for a share of 500/1000 (the most on one node: 2)")


def test_a_part_above_the_limit_is_never_chosen():
    placed = choose_parts([gpu(1, price=300)], share(250, limit=200))

    assert placed.reason == ("no share within the limit: the cheapest is 300 µ$ per hour "
                             "(limit 200)")


def test_a_share_of_a_whole_gpu_is_not_a_part():
    with pytest.raises(InvalidInput):
        share(1000)


def test_part_prices_follow_the_gpu_price_unless_the_provider_priced_the_slice():
    assert share_price_micros(2_800_000, 250) == 700_000
    assert slice_price_micros(2_800_000, "3g.40gb", {}) == 1_200_000
    assert slice_price_micros(2_800_000, "3g.40gb", {"3g.40gb": 1_000_000}) == 1_000_000
    assert slice_price_micros(1_000_001, "1g.10gb", {}) == 142_857  # half to even


# --- moving parts so that whole GPUs are free -------------------------------------------------


def held(lease, gid, span, movable=True, paid=100, profile=""):
    return HeldPart(lease=lease, gpu=gid, span=span, mig_profile=profile, movable=movable,
                    paid_micros=paid)


def test_two_lightly_used_gpus_become_one_whole_free_gpu():
    gpus = [gpu(1, name="share:300"), gpu(2, name="share:300")]

    moves = plan_part_moves(gpus, [held(10, 1, (0, 300)), held(11, 2, (0, 300))])

    assert len(moves) == 1
    [move] = moves
    assert move.away_from in (1, 2) and move.onto[0][1] == (300, 600)


def test_parts_a_tenant_did_not_let_move_stay_where_they_are():
    gpus = [gpu(1, name="share:300"), gpu(2, name="share:300")]

    assert plan_part_moves(gpus, [held(10, 1, (0, 300), movable=False),
                                  held(11, 2, (0, 300), movable=False)]) == []


def test_a_part_never_moves_onto_a_whole_free_gpu_or_a_dearer_one():
    gpus = [gpu(1, name="share:300"), gpu(2, name="share:300", price=200), gpu(3)]

    [move] = plan_part_moves(gpus, [held(10, 1, (0, 300)), held(11, 2, (0, 300), paid=200)])
    assert (move.lease, move.away_from, move.onto[0][0]) == (11, 2, 1)  # 10 may not go to 2


def test_a_leases_shares_stay_on_one_node_and_on_distinct_gpus():
    gpus = [gpu(1, node="a", name="share:300"), gpu(2, node="a", index=1, name="share:300"),
            gpu(3, node="b", name="share:300")]
    parts = [held(10, 1, (0, 300)), held(10, 2, (0, 300)), held(11, 3, (0, 300))]

    moves = plan_part_moves(gpus, parts)

    # lease 10 cannot put both shares on one GPU, nor move one to node b; 11 may join node a
    assert [(m.lease, m.away_from) for m in moves] == [(11, 3)]

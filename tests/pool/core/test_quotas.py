"""Hand-worked scenarios for the pure quota core (pool/core/quotas.py); no database needed."""

import pytest

from pool.core.quotas import (
    ModelQuota,
    QuotaError,
    QuotaNode,
    QuotaTree,
    RunningLease,
    TidalSchedule,
    Workload,
    admit,
    apply_schedule,
    available_to,
    dominant_share,
    give_way,
    is_placeable,
    may_take,
    reclaim,
    reserve_cells,
    usage_of,
)

H = "H100-80GB"


def q(nominal, borrowing_limit=None, lending_limit=None):
    return {H: ModelQuota(nominal, borrowing_limit, lending_limit)}


def wl(id, queue, gpus, priority=0, at=0):
    return Workload(id, queue, H, gpus, priority, at)


def lease(id, queue, gpus, priority=0, at=0):
    return RunningLease(id, queue, H, gpus, priority, at)


def ids(admission):
    return [w.id for w, _ in admission.admitted]


# -- the tree ------------------------------------------------------------------------------
def test_tree_validation():
    with pytest.raises(QuotaError):
        QuotaTree([QuotaNode("a"), QuotaNode("a")])
    with pytest.raises(QuotaError):
        QuotaTree([QuotaNode("a", parent="nowhere")])
    with pytest.raises(QuotaError):
        QuotaTree([QuotaNode("a", parent="b"), QuotaNode("b", parent="a")])
    with pytest.raises(QuotaError):
        QuotaTree([QuotaNode("a", parent="b", cohort="c"), QuotaNode("b")])
    with pytest.raises(QuotaError):
        ModelQuota(-1)
    tree = QuotaTree([QuotaNode("physics", cohort="campus", quotas=q(8))])
    assert tree.queues() == ["physics"]
    assert "campus" in tree and "nowhere" not in tree
    assert tree.ancestors("physics") == ["campus"]
    assert not tree.is_queue("campus")


def test_lone_queue_has_its_nominal_and_nothing_more():
    tree = QuotaTree([QuotaNode("solo", quotas=q(8, borrowing_limit=100))])
    assert available_to(tree, "solo", H, {}) == 8
    assert available_to(tree, "solo", H, {"solo": {H: 5}}) == 3
    assert available_to(tree, "solo", "A100", {}) == 0  # no quota for that model
    result = admit(tree, {}, [wl("w", "solo", 9)])
    assert result.waiting[0][1] == "needs 9 GPUs: 8 free in quota solo, no cohort to borrow from"


# -- borrowing and lending in a cohort -----------------------------------------------------
def campus(physics=None, chemistry=None):
    return QuotaTree([
        QuotaNode("physics", cohort="campus", quotas=physics or q(8, borrowing_limit=8)),
        QuotaNode("chemistry", cohort="campus", quotas=chemistry or q(16)),
    ])


def test_borrowing_within_the_limit():
    tree = campus()
    # 8 own + min(cohort free 24, borrowing limit 8) = 16
    assert available_to(tree, "physics", H, {}) == 16
    result = admit(tree, {}, [wl("job", "physics", 12)])
    assert [(w.id, b) for w, b in result.admitted] == [("job", 4)]
    assert result.usage["physics"][H] == 12
    # chemistry may borrow all of physics' unused nominal (no limit): 16 + 8 - 4 borrowed
    assert available_to(tree, "chemistry", H, result.usage) == 12


def test_refusal_beyond_the_borrowing_limit_names_the_reason():
    tree = campus()
    usage = {"physics": {H: 4}}
    result = admit(tree, usage, [wl("big", "physics", 16)])
    assert result.admitted == ()
    assert result.waiting[0][1] == (
        "needs 16 GPUs: 4 free in quota physics, cohort can lend 8 (borrowing limit 8)")
    assert admit(tree, usage, [wl("ok", "physics", 12)]).admitted[0][1] == 8
    never = admit(tree, {}, [wl("never", "physics", 17)])
    assert never.waiting[0][1] == (
        "needs 17 GPUs: 8 free in quota physics, cohort can lend 8 (borrowing limit 8), "
        "more than the queue may ever hold")


def test_borrowing_limit_counts_what_is_already_borrowed():
    tree = campus()
    usage = {"physics": {H: 14}}  # borrowing 6 of 8
    assert available_to(tree, "physics", H, usage) == 2
    result = admit(tree, usage, [wl("w", "physics", 3)])
    assert result.waiting[0][1] == ("needs 3 GPUs: 0 free in quota physics, cohort can lend 2 "
                                    "(borrowing limit 8), already borrowing 6")


def test_cohort_can_only_lend_what_others_leave_unused():
    tree = campus()
    usage = {"chemistry": {H: 13}}  # 3 of chemistry's 16 unused
    assert available_to(tree, "physics", H, usage) == 11
    result = admit(tree, usage, [wl("w", "physics", 12)])
    assert result.waiting[0][1] == ("needs 12 GPUs: 8 free in quota physics, cohort can lend 3 "
                                    "(borrowing limit 8)")


def test_lending_limit_is_respected():
    tree = campus(physics=q(8), chemistry=q(16, lending_limit=4))
    assert tree.guaranteed("chemistry", H) == 12
    assert available_to(tree, "physics", H, {}) == 12  # 8 + only 4 lent by chemistry
    result = admit(tree, {}, [wl("a", "physics", 12), wl("b", "physics", 1, at=1)])
    assert ids(result) == ["a"]
    assert result.waiting[0][1] == "needs 1 GPU: 0 free in quota physics, cohort can lend 0"
    # chemistry keeps its 12 guaranteed GPUs whatever physics does
    assert available_to(tree, "chemistry", H, result.usage) == 12


def test_lending_limit_of_the_borrower_protects_its_own_share():
    tree = campus(physics=q(8, lending_limit=2), chemistry=q(16))
    # physics keeps 6 for itself; chemistry can borrow 2
    assert available_to(tree, "chemistry", H, {}) == 18
    assert available_to(tree, "physics", H, {"chemistry": {H: 18}}) == 6


def test_unknown_queue_model_and_group_wait_with_reasons():
    tree = campus()
    result = admit(tree, {}, [
        Workload("x", "nowhere", H, 1), Workload("y", "physics", "A100", 1),
        Workload("z", "campus", H, 1), Workload("zero", "physics", H, 0)])
    reasons = {w.id: r for w, r in result.waiting}
    assert reasons == {
        "x": "no quota queue named nowhere",
        "y": "quota physics has no quota for A100",
        "z": "campus groups other queues; submit to one of them",
        "zero": "needs 0 GPUs: a workload must ask for at least one",
    }


# -- admission order -----------------------------------------------------------------------
def test_priority_first_then_fifo_all_or_nothing():
    tree = QuotaTree([QuotaNode("training", quotas=q(16))])
    pending = [
        wl("old-low", "training", 8, priority=0, at=1),
        wl("new-high", "training", 12, priority=5, at=9),
        wl("mid-high", "training", 4, priority=5, at=5),
        wl("late-low", "training", 2, priority=0, at=7),
    ]
    result = admit(tree, {}, pending)
    # priority 5 first, FIFO: mid-high (4) then new-high (12) = 16; the rest must wait whole
    assert ids(result) == ["mid-high", "new-high"]
    assert [w.id for w, _ in result.waiting] == ["old-low", "late-low"]


def test_a_head_that_does_not_fit_lets_smaller_ones_pass():
    tree = QuotaTree([QuotaNode("training", quotas=q(8))])
    result = admit(tree, {}, [wl("big", "training", 12, at=1), wl("small", "training", 4, at=2)])
    assert ids(result) == ["small"]
    assert result.waiting[0][0].id == "big"


def test_queues_within_nominal_go_before_borrowers():
    tree = QuotaTree([
        QuotaNode("inference", cohort="c", quotas=q(8)),
        QuotaNode("training", cohort="c", quotas=q(8)),
    ])
    # training asks first but must borrow; inference fits in its nominal
    result = admit(tree, {}, [wl("t", "training", 12, at=1), wl("i", "inference", 8, at=2)])
    assert ids(result) == ["i"]
    assert result.waiting[0][1] == "needs 12 GPUs: 8 free in quota training, cohort can lend 0"


def test_fair_sharing_the_least_loaded_borrower_goes_first():
    tree = QuotaTree([
        QuotaNode("physics", cohort="campus", quotas=q(8)),
        QuotaNode("biology", cohort="campus", quotas=q(8)),
        QuotaNode("chemistry", cohort="campus", quotas=q(4)),
    ])
    usage = {"physics": {H: 8}, "biology": {H: 4}}
    assert dominant_share(tree, "physics", usage) == 1
    assert dominant_share(tree, "biology", usage) == 0.5
    # both must borrow; physics asked first, but biology uses less of its nominal
    result = admit(tree, usage, [wl("p", "physics", 4, at=1), wl("b", "biology", 8, at=2)])
    assert [(w.id, b) for w, b in result.admitted] == [("b", 4)]
    assert result.waiting[0][1] == "needs 4 GPUs: 0 free in quota physics, cohort can lend 0"


def test_fair_sharing_alternates_between_equal_borrowers():
    tree = QuotaTree([
        QuotaNode("physics", cohort="campus", quotas=q(4)),
        QuotaNode("biology", cohort="campus", quotas=q(4)),
        QuotaNode("chemistry", cohort="campus", quotas=q(8)),
    ])
    usage = {"physics": {H: 4}, "biology": {H: 4}}
    pending = [wl(f"p{i}", "physics", 1, at=i) for i in range(6)]
    pending += [wl(f"b{i}", "biology", 1, at=10 + i) for i in range(6)]
    result = admit(tree, usage, pending)
    assert ids(result) == ["p0", "b0", "p1", "b1", "p2", "b2", "p3", "b3"]
    assert result.usage["physics"][H] == result.usage["biology"][H] == 8


def test_dominant_share_takes_the_largest_model():
    tree = QuotaTree([QuotaNode("x", quotas={H: ModelQuota(8), "A100": ModelQuota(4)}),
                      QuotaNode("y", quotas={})])
    assert dominant_share(tree, "x", {"x": {H: 2, "A100": 3}}) == 0.75
    assert dominant_share(tree, "y", {"y": {H: 1}}) > 10**9


# -- nested quotas -------------------------------------------------------------------------
def university():
    return QuotaTree([
        QuotaNode("university"),
        QuotaNode("science", parent="university", quotas=q(0, borrowing_limit=4)),
        QuotaNode("physics", parent="science", quotas=q(8)),
        QuotaNode("chemistry", parent="science", quotas=q(8)),
        QuotaNode("engineering", parent="university", quotas=q(16)),
    ])


def test_parent_borrowing_limit_binds_its_children():
    tree = university()
    assert tree.subtree_quota("university", H) == 32
    # physics has no limit of its own, but science may borrow only 4 beyond its 16
    assert available_to(tree, "physics", H, {}) == 20
    usage = {"chemistry": {H: 8}}
    assert available_to(tree, "physics", H, usage) == 12
    result = admit(tree, usage, [wl("w", "physics", 13)])
    assert result.waiting[0][1] == "needs 13 GPUs: 8 free in quota physics, cohort can lend 4"
    # engineering may borrow all of science's unused quota
    assert available_to(tree, "engineering", H, usage) == 24


def test_parent_lending_limit_keeps_a_department_whole():
    tree = QuotaTree([
        QuotaNode("university"),
        QuotaNode("science", parent="university", quotas=q(0, lending_limit=0)),
        QuotaNode("physics", parent="science", quotas=q(8)),
        QuotaNode("chemistry", parent="science", quotas=q(8)),
        QuotaNode("engineering", parent="university", quotas=q(16)),
    ])
    assert available_to(tree, "engineering", H, {}) == 16
    assert available_to(tree, "physics", H, {}) == 32  # siblings lend; engineering lends too
    assert available_to(tree, "physics", H, {"engineering": {H: 16}}) == 16


def test_inner_node_with_gpus_of_its_own():
    tree = QuotaTree([
        QuotaNode("lab", quotas=q(8)),
        QuotaNode("a", parent="lab", quotas=q(2)),
        QuotaNode("b", parent="lab", quotas=q(2, borrowing_limit=1)),
    ])
    assert available_to(tree, "a", H, {}) == 12
    assert available_to(tree, "b", H, {}) == 3


# -- reclaim -------------------------------------------------------------------------------
def cluster(training_policy=False):
    return QuotaTree([
        QuotaNode("inference", cohort="cluster", quotas=q(16)),
        QuotaNode("training", cohort="cluster", quotas=q(16),
                  preempt_within_queue=training_policy),
    ])


RUNNING = [
    lease("i1", "inference", 8, at=0),
    lease("t1", "training", 8, priority=0, at=1),
    lease("t4", "training", 8, priority=0, at=3),
    lease("t2", "training", 4, priority=0, at=5),
    lease("t3", "training", 4, priority=1, at=6),
]  # training uses 24: 8 borrowed from inference


def test_reclaim_takes_only_what_is_needed_and_drops_the_spare():
    tree = cluster()
    request = wl("r", "inference", 8)
    assert available_to(tree, "inference", H, usage_of(RUNNING)) == 0
    # order: t2 (prio 0, newest), t4, t1, t3; t2 alone frees 4, t2+t4 frees 12 (enough);
    # then t2 is given back: t4 alone is enough
    assert reclaim(tree, None, RUNNING, request) == ["t4"]


def test_reclaim_lowest_priority_most_recent_first():
    tree = cluster()
    assert reclaim(tree, None, RUNNING, wl("r", "inference", 4)) == ["t2"]


def test_reclaim_never_takes_what_is_within_the_lenders_nominal():
    tree = cluster()
    # inference asks for all 8 still in its nominal, but training only borrows 8: one
    # borrowed lease (t4) covers it and then training is within nominal; nothing else goes
    running = RUNNING + [lease("t5", "training", 0, at=9)]
    assert reclaim(tree, None, running, wl("r", "inference", 8)) == ["t4"]
    # a request beyond inference's nominal may not reclaim at all
    assert reclaim(tree, None, RUNNING, wl("r", "inference", 9)) == []


def test_reclaim_needs_two_leases():
    tree = QuotaTree([
        QuotaNode("inference", cohort="cluster", quotas=q(16)),
        QuotaNode("training", cohort="cluster", quotas=q(8)),
    ])
    running = [lease("a", "training", 4, at=1), lease("b", "training", 4, at=2),
               lease("c", "training", 4, at=3), lease("d", "training", 4, at=4),
               lease("e", "training", 4, priority=3, at=5)]
    # training 20 on a nominal of 8: 12 borrowed; inference wants 10 of its 16 (4 are free)
    assert reclaim(tree, None, running, wl("r", "inference", 10)) == ["d", "c"]


def test_reclaim_returns_nothing_when_it_fits_or_cannot_fit():
    tree = cluster()
    assert reclaim(tree, None, [], wl("r", "inference", 8)) == []
    running = [lease("t", "training", 16), lease("i", "inference", 16)]
    assert reclaim(tree, None, running, wl("r", "inference", 1)) == []


def test_priority_preemption_within_a_queue():
    tree = QuotaTree([QuotaNode("training", quotas=q(16), preempt_within_queue=True)])
    running = [lease("low-old", "training", 8, priority=0, at=1),
               lease("high", "training", 8, priority=5, at=2)]
    assert reclaim(tree, None, running, wl("r", "training", 8, priority=3)) == ["low-old"]
    assert reclaim(tree, None, running, wl("r", "training", 8, priority=0)) == []
    assert reclaim(tree, None, running, wl("r", "training", 16, priority=9)) == [
        "low-old", "high"]
    no_policy = QuotaTree([QuotaNode("training", quotas=q(16))])
    assert reclaim(no_policy, None, running, wl("r", "training", 8, priority=3)) == []


def test_cohort_reclaim_before_priority_preemption():
    tree = cluster(training_policy=True)
    running = [lease("own", "training", 8, priority=0, at=1),
               lease("inf", "inference", 24, priority=9, at=2)]
    # inference borrows 8; training asks 8 more, within its nominal: the borrowed lease goes,
    # not training's own lower-priority lease
    assert reclaim(tree, None, running, wl("r", "training", 8, priority=5)) == ["inf"]
    # beyond its nominal only its own lower-priority lease may go, and that is not enough
    assert reclaim(tree, None, running, wl("r", "training", 16, priority=5)) == []
    # ... but it is when inference is within its nominal
    running = [lease("own", "training", 16, priority=0, at=1),
               lease("inf", "inference", 16, priority=9, at=2)]
    assert reclaim(tree, None, running, wl("r", "training", 8, priority=5)) == ["own"]


# -- tidal schedules -----------------------------------------------------------------------
DAY, NIGHT = 8 * 3600, 22 * 3600


def tidal_pool():
    tree = QuotaTree([
        QuotaNode("inference", cohort="pool", quotas=q(1843)),
        QuotaNode("training", cohort="pool", quotas=q(205)),
    ])
    schedule = TidalSchedule([
        (NIGHT, {"training": {H: 1843}, "inference": {H: 205}}),
        (DAY, {"inference": {H: 1843}, "training": {H: 205}}),
    ])
    return tree, schedule


def test_schedule_lookup_wraps_around_the_day():
    _, schedule = tidal_pool()
    assert schedule.nominals_at(12 * 3600)["inference"][H] == 1843
    assert schedule.nominals_at(23 * 3600)["inference"][H] == 205
    assert schedule.nominals_at(3600)["inference"][H] == 205  # before 08:00: still night
    with pytest.raises(QuotaError):
        TidalSchedule([])


def test_tidal_switch_moves_80_percent_of_2048_gpus():
    tree, schedule = tidal_pool()
    running = [lease(f"inf-lo-{i:03}", "inference", 8, priority=0, at=i) for i in range(200)]
    running += [lease(f"inf-hi-{i:02}", "inference", 8, priority=1, at=i) for i in range(30)]
    running += [lease(f"train-{i:02}", "training", 8, at=i) for i in range(25)]
    usage = usage_of(running)
    assert usage == {"inference": {H: 1840}, "training": {H: 200}}

    day = apply_schedule(tree, schedule, 20 * 3600, usage)
    assert day.excess == ()
    night = apply_schedule(tree, schedule, NIGHT, usage)
    moved = 1843 - 205
    assert moved == 1638 and round(moved / 2048, 2) == 0.80
    assert night.tree.nominal("training", H) == 1843
    assert night.excess == (("inference", H, 1635),)

    victims = give_way(running, night.excess)
    # all 200 priority-0 leases (1,600 GPUs), then the 5 newest priority-1 leases (40 GPUs):
    # 1,640 >= 1,635, and no single chosen lease can be spared (1,632 < 1,635)
    expected = [f"inf-lo-{i:03}" for i in reversed(range(200))]
    expected += [f"inf-hi-{i:02}" for i in (29, 28, 27, 26, 25)]
    assert victims == expected
    # reclaim, asked for training's new nominal, picks exactly the same leases
    request = wl("night-train", "training", 1843 - 200)
    assert sorted(reclaim(night.tree, usage, running, request)) == sorted(expected)
    left = usage_of([r for r in running if r.id not in set(victims)])
    assert left["inference"][H] == 200 <= 205
    assert available_to(night.tree, "training", H, left) >= 1643


def test_give_way_drops_a_lease_not_needed():
    running = [lease("big", "q", 8, at=1), lease("small", "q", 2, at=2)]
    # order: small (newest) then big; small+big = 10 >= 8, then small is given back
    assert give_way(running, [("q", H, 8)]) == ["big"]
    assert give_way(running, [("q", H, 0)]) == []


# -- shaped guarantees ---------------------------------------------------------------------
def test_reserve_cells_best_fit_and_exact():
    leaves = {"leaf1": 8, "leaf2": 4, "leaf3": 6}
    assert reserve_cells(leaves, {"big": 8, "mid": 4}) == {"big": "leaf1", "mid": "leaf2"}
    # best-fit-first alone would put 5 into leaf3 (6) and then fail 6; the search does not
    assert reserve_cells({"a": 6, "b": 7}, {"x": 5, "y": 6, "z": 1}) == {
        "x": "b", "y": "a", "z": "b"}
    assert is_placeable(leaves, {"a": 8, "b": 6, "c": 4})
    assert not is_placeable(leaves, {"a": 9})
    assert reserve_cells(leaves, {"huge": 9, "small": 2}) == {"huge": None, "small": "leaf2"}


def test_small_leases_are_kept_off_reserved_cells():
    leaves = {"leaf1": 8, "leaf2": 4}
    shapes = {"physics-8-nodes": 8}
    assert not may_take(leaves, shapes, "leaf1", 1)
    assert may_take(leaves, shapes, "leaf2", 4)
    assert not may_take(leaves, shapes, "leaf2", 5)

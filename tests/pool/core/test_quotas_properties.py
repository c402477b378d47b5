"""Properties of the pure quota core (pool/core/quotas.py), checked with Hypothesis."""

import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool.core.quotas import (
    ModelQuota,
    QuotaNode,
    QuotaTree,
    RunningLease,
    Workload,
    admit,
    available_to,
    give_way,
    is_placeable,
    reclaim,
    reserve_cells,
    usage_of,
)

MODELS = ("H100", "A100")
FAST = settings(max_examples=120, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@st.composite
def model_quota(draw, max_nominal=16):
    nominal = draw(st.integers(0, max_nominal))
    borrowing = draw(st.one_of(st.none(), st.integers(0, 16)))
    lending = draw(st.one_of(st.none(), st.integers(0, max(nominal, 1))))
    return ModelQuota(nominal, borrowing, lending)


@st.composite
def flat_cohort(draw):
    n = draw(st.integers(2, 4))
    nodes = []
    for i in range(n):
        quotas = {m: draw(model_quota()) for m in MODELS if draw(st.booleans()) or m == "H100"}
        nodes.append(QuotaNode(f"q{i}", cohort="cohort", quotas=quotas,
                               preempt_within_queue=draw(st.booleans())))
    return QuotaTree(nodes)


@st.composite
def nested_tree(draw):
    nodes = [QuotaNode("root", quotas={"H100": ModelQuota(draw(st.integers(0, 4)))})]
    for d in range(draw(st.integers(1, 3))):
        nodes.append(QuotaNode(f"d{d}", parent="root",
                               quotas={"H100": draw(model_quota(max_nominal=4))}))
        for g in range(draw(st.integers(1, 3))):
            nodes.append(QuotaNode(f"d{d}g{g}", parent=f"d{d}",
                                   quotas={"H100": draw(model_quota())}))
    return QuotaTree(nodes)


trees = st.one_of(flat_cohort(), nested_tree())


@st.composite
def workloads(draw, tree):
    queues = tree.queues()
    out = []
    for i in range(draw(st.integers(0, 14))):
        out.append(Workload(f"w{i:02}", draw(st.sampled_from(queues)),
                            draw(st.sampled_from(MODELS)), draw(st.integers(1, 12)),
                            draw(st.integers(0, 2)), draw(st.integers(0, 5))))
    return out


@st.composite
def scenario(draw):
    tree = draw(trees)
    # a feasible starting usage: what a first admission pass leaves
    first = admit(tree, {}, draw(workloads(tree)))
    return tree, first.usage, draw(workloads(tree))


def limit_violations(tree, usage):
    bad = []
    for name in tree.nodes:
        node = tree.node(name)
        for model in MODELS:
            q = node.quota(model)
            used = tree.used(name, model, usage)
            subtree, guaranteed = tree.subtree_quota(name, model), tree.guaranteed(name, model)
            if tree.is_queue(name) and q is None and used:
                bad.append((name, model, "used without quota"))
            if q is not None and q.borrowing_limit is not None:
                if used > subtree + q.borrowing_limit:
                    bad.append((name, model, "borrowing limit"))
            if node.parent is None and used > subtree:
                bad.append((name, model, "cohort capacity"))
            if tree.available(name, model, usage) < max(0, guaranteed - used):
                bad.append((name, model, "guaranteed quota lent away"))
    return bad


@FAST
@given(scenario())
def test_admission_respects_every_limit(case):
    tree, usage, pending = case
    assert limit_violations(tree, usage) == []
    result = admit(tree, usage, pending)
    assert limit_violations(tree, result.usage) == []
    for root in {tree.root(q) for q in tree.queues()}:
        for model in MODELS:
            # all GPUs in use under a cohort never exceed what the cohort holds
            assert tree.total_used(root, model, result.usage) <= tree.capacity(root, model)


@FAST
@given(flat_cohort().flatmap(lambda t: st.tuples(st.just(t), workloads(t), workloads(t))))
def test_lending_limits_hold_in_a_flat_cohort(case):
    tree, first, second = case
    usage = admit(tree, admit(tree, {}, first).usage, second).usage
    queues = tree.queues()
    for model in MODELS:
        total_nominal = sum(tree.nominal(q, model) for q in queues)
        for q in queues:
            others = sum(usage.get(o, {}).get(model, 0) for o in queues if o != q)
            # the others never eat into q's guaranteed (non-lendable) quota
            assert others <= total_nominal - tree.guaranteed(q, model)


@FAST
@given(scenario())
def test_admission_accounting_and_maximality(case):
    tree, usage, pending = case
    result = admit(tree, usage, pending)
    assert len(result.admitted) + len(result.waiting) == len(pending)
    expected = {q: dict(m) for q, m in usage.items()}
    for w, borrowed in result.admitted:
        before = expected.setdefault(w.queue, {}).get(w.model, 0)
        nominal = tree.nominal(w.queue, w.model)
        assert borrowed == max(0, before + w.gpus - nominal) - max(0, before - nominal)
        expected[w.queue][w.model] = before + w.gpus
    assert {q: {m: g for m, g in ms.items() if g} for q, ms in expected.items()} == {
        q: {m: g for m, g in ms.items() if g} for q, ms in result.usage.items()}
    for w, reason in result.waiting:
        assert reason
        # nothing left waiting would fit now
        assert w.gpus > available_to(tree, w.queue, w.model, result.usage)


@FAST
@given(scenario(), st.randoms(use_true_random=False))
def test_admission_is_deterministic_under_shuffled_input(case, rnd):
    tree, usage, pending = case
    shuffled = list(pending)
    rnd.shuffle(shuffled)
    a, b = admit(tree, usage, pending), admit(tree, usage, shuffled)
    assert a.admitted == b.admitted
    assert a.waiting == b.waiting


@FAST
@given(scenario())
def test_priority_order_holds_per_queue(case):
    tree, usage, pending = case
    result = admit(tree, usage, pending)
    seen = {}
    for w, _ in result.admitted:
        key = w.queue
        if key in seen:
            prev = seen[key]
            assert (-prev.priority, prev.submitted_at, prev.id) < (
                -w.priority, w.submitted_at, w.id)
        seen[key] = w


@st.composite
def reclaim_case(draw):
    tree = draw(flat_cohort())
    queues = tree.queues()
    candidates = draw(workloads(tree))
    admitted = admit(tree, {}, candidates).admitted
    running = [RunningLease(f"l{i:02}", w.queue, w.model, w.gpus, draw(st.integers(0, 3)),
                            draw(st.integers(0, 9))) for i, (w, _) in enumerate(admitted)]
    request = Workload("req", draw(st.sampled_from(queues)), "H100",
                       draw(st.integers(1, 16)), draw(st.integers(0, 3)))
    return tree, running, request


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(reclaim_case())
def test_reclaim_frees_enough_minimally_and_only_allowed_leases(case):
    tree, running, request = case
    usage = usage_of(running)
    victims = reclaim(tree, usage, running, request)
    assert len(set(victims)) == len(victims)
    fits_now = request.gpus <= available_to(tree, request.queue, request.model, usage)
    if fits_now:
        assert victims == []
    if not victims:
        return
    by_id = {r.id: r for r in running}
    within_nominal = (usage.get(request.queue, {}).get(request.model, 0) + request.gpus
                      <= tree.nominal(request.queue, request.model))
    for v in victims:
        lease = by_id[v]
        assert lease.model == request.model
        if lease.queue == request.queue:
            assert tree.node(request.queue).preempt_within_queue
            assert lease.priority < request.priority
        else:
            assert within_nominal
            nominal = tree.nominal(lease.queue, lease.model)
            assert usage[lease.queue][lease.model] > nominal  # a borrowing queue

    def fits(ids):
        left = usage_of([r for r in running if r.id not in ids])
        return request.gpus <= available_to(tree, request.queue, request.model, left)

    assert fits(set(victims))
    for v in victims:  # minimal: none of them can be spared
        assert not fits(set(victims) - {v})


@FAST
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6), st.integers(0, 9)),
                max_size=12),
       st.integers(0, 30))
def test_give_way_frees_the_excess_minimally(specs, excess):
    running = [RunningLease(f"l{i:02}", "q", "H100", gpus, priority, started)
               for i, (priority, gpus, started) in enumerate(specs)]
    victims = give_way(running, [("q", "H100", excess)])
    gpus = {r.id: r.gpus for r in running}
    freed = sum(gpus[v] for v in victims)
    if excess <= 0:
        assert victims == []
    elif sum(gpus.values()) >= excess:
        assert freed >= excess
        for v in victims:
            assert freed - gpus[v] < excess
    else:
        assert set(victims) == set(gpus)


def brute_force_placeable(leaves, shapes):
    names = sorted(leaves)
    quotas = [q for q in sorted(shapes) if shapes[q] > 0]
    for choice in itertools.product(names, repeat=len(quotas)):
        load = dict.fromkeys(names, 0)
        for quota, leaf in zip(quotas, choice, strict=True):
            load[leaf] += shapes[quota]
        if all(load[leaf] <= leaves[leaf] for leaf in names):
            return True
    return not quotas


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.dictionaries(st.sampled_from(["l1", "l2", "l3"]), st.integers(0, 10), min_size=1),
       st.dictionaries(st.sampled_from(["p", "q", "r", "s"]), st.integers(1, 8), max_size=4))
def test_reserve_cells_is_exact_and_within_capacity(leaves, shapes):
    placeable = is_placeable(leaves, shapes)
    assert placeable == brute_force_placeable(leaves, shapes)
    cells = reserve_cells(leaves, shapes)
    assert set(cells) == set(shapes)
    load = dict.fromkeys(leaves, 0)
    for quota, leaf in cells.items():
        if leaf is not None:
            load[leaf] += shapes[quota]
    assert all(load[leaf] <= leaves[leaf] for leaf in leaves)
    if placeable:
        assert None not in cells.values()
    assert reserve_cells(dict(reversed(list(leaves.items()))), shapes) == cells


def test_admission_is_fast_enough_for_a_busy_queue():
    rnd = random.Random(7)
    tree = QuotaTree([QuotaNode(f"q{i}", cohort="pool",
                                quotas={"H100": ModelQuota(64, borrowing_limit=128)})
                      for i in range(8)])
    pending = [Workload(f"w{i:04}", f"q{rnd.randrange(8)}", "H100", rnd.choice([1, 2, 4, 8]),
                        rnd.randrange(3), rnd.randrange(1000)) for i in range(400)]
    result = admit(tree, {}, pending)
    assert sum(w.gpus for w, _ in result.admitted) <= 512

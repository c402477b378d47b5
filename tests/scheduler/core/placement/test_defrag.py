"""The defragmentation planner on hand-built layouts: leaves of nodes of 8 GPUs."""

from scheduler.core.placement.defrag import (
    GpuSlot,
    LeaseView,
    NodeView,
    plan_defrag,
    whole_free_counts,
)

PRICE = 2_000_000


def layout(leaves: dict[str, list[str]], gpus=8, model="H100-80GB", unpriced=()):
    """Nodes named by leaf; GPU ids are node number * 100 + index."""
    nodes, number = [], 0
    for leaf, names in leaves.items():
        for name in names:
            number += 1
            nodes.append(NodeView(name=name, leaf=leaf, gpu_model=model, gpus=tuple(
                GpuSlot(id=number * 100 + i,
                        price_micros=None if name in unpriced else PRICE)
                for i in range(gpus))))
    return nodes


def on(nodes, name, count, start=0):
    node = next(n for n in nodes if n.name == name)
    return frozenset(g.id for g in node.gpus[start:start + count])


def lease(id, gpus, movable=True, model="H100-80GB", ends_at=10.0):
    return LeaseView(id=id, gpu_model=model, gpus=gpus, movable=movable,
                     max_price_micros=3_000_000, ends_at=ends_at)


def where(plan, nodes, leases):
    """Lease id → the nodes it holds after the plan."""
    node_of = {g.id: n.name for n in nodes for g in n.gpus}
    held = {x.id: set(x.gpus) for x in leases}
    for move in plan.moves:
        held[move.lease] = (held[move.lease] - set(move.away_from)) | {g for g, _ in move.onto}
    return {k: {node_of[g] for g in v} for k, v in held.items()}


def test_two_half_used_leaves_become_one_full_leaf_and_one_free_leaf():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    leases = [lease(1, on(nodes, "a1", 8)), lease(2, on(nodes, "b1", 8))]

    plan = plan_defrag(nodes, leases)

    assert len(plan.moves) == 1
    assert plan.before.whole_free_leaves == 0 and plan.after.whole_free_leaves == 1
    assert plan.before.whole_free_nodes == 2 and plan.after.whole_free_nodes == 2
    after = where(plan, nodes, leases)
    assert {n[0] for n in after[1] | after[2]} in ({"a"}, {"b"})  # both in one leaf now


def test_a_lease_that_did_not_allow_moves_stays_and_the_other_one_moves_to_it():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    leases = [lease(1, on(nodes, "a1", 8), movable=False), lease(2, on(nodes, "b1", 8))]

    plan = plan_defrag(nodes, leases)

    assert [m.lease for m in plan.moves] == [2]
    assert where(plan, nodes, leases) == {1: {"a1"}, 2: {"a2"}}
    assert plan.after.whole_free_leaves == 1


def test_nothing_moves_when_no_lease_may_move():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    leases = [lease(1, on(nodes, "a1", 8), movable=False),
              lease(2, on(nodes, "b1", 8), movable=False)]

    plan = plan_defrag(nodes, leases)

    assert plan.moves == () and plan.before == plan.after


def test_a_lease_spread_over_two_leaves_is_gathered_into_one():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    spread = lease(1, on(nodes, "a1", 4) | on(nodes, "b1", 4))

    plan = plan_defrag(nodes, [spread])

    (move,) = plan.moves
    assert len(where(plan, nodes, [spread])[1]) == 1  # one node, so one leaf
    assert plan.after.whole_free_leaves == 1 and plan.after.whole_free_nodes == 3
    assert plan.before.whole_free_leaves == 0 and plan.before.whole_free_nodes == 2


def test_small_leases_breaking_up_nodes_are_packed_onto_one_node():
    nodes = layout({"L1": ["a1", "a2"]})
    leases = [lease(1, on(nodes, "a1", 2)), lease(2, on(nodes, "a2", 2))]

    plan = plan_defrag(nodes, leases)

    after = where(plan, nodes, leases)
    assert after[1] == after[2]
    assert plan.before.whole_free_nodes == 0 and plan.after.whole_free_nodes == 1
    assert plan.after.whole_free_leaves == 0


def test_a_lease_on_one_node_is_never_split_over_nodes():
    # Moving the 8-GPU lease from b1 would free leaf L2 only if it split over a1 and a2.
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1"]})
    leases = [lease(1, on(nodes, "a1", 4), movable=False),
              lease(2, on(nodes, "a2", 4), movable=False), lease(3, on(nodes, "b1", 8))]

    plan = plan_defrag(nodes, leases)

    assert plan.moves == ()


def test_gpus_not_for_sale_or_too_dear_or_of_another_model_are_no_target():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]}, unpriced={"a2"})
    leases = [lease(1, on(nodes, "a1", 8), movable=False), lease(2, on(nodes, "b1", 8))]

    assert plan_defrag(nodes, leases).moves == ()
    dear = [lease(1, on(nodes, "a1", 8), movable=False),
            LeaseView(id=2, gpu_model="H100-80GB", gpus=on(nodes, "b1", 8), movable=True,
                      max_price_micros=PRICE - 1)]
    assert plan_defrag(layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]}), dear).moves == ()
    other = [lease(1, on(nodes, "a1", 8), movable=False),
             lease(2, on(nodes, "b1", 8), model="A100-80GB")]
    assert plan_defrag(layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]}), other).moves == ()


def test_a_gpu_reserved_before_the_lease_ends_is_no_target():
    plain = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    reserved = [n if n.name != "a2" else NodeView(n.name, n.leaf, n.gpu_model, tuple(
        GpuSlot(g.id, price_micros=PRICE, free_until=5.0) for g in n.gpus)) for n in plain]
    leases = [lease(1, on(plain, "a1", 8), movable=False), lease(2, on(plain, "b1", 8),
                                                                  ends_at=10.0)]

    assert plan_defrag(reserved, leases).moves == ()


def test_moves_are_capped_and_each_lease_moves_at_most_once():
    nodes = layout({f"L{i}": [f"n{i}a", f"n{i}b"] for i in range(6)})
    leases = [lease(i, on(nodes, f"n{i}a", 8)) for i in range(6)]

    capped = plan_defrag(nodes, leases, max_moves=1)
    full = plan_defrag(nodes, leases)

    assert len(capped.moves) == 1 and capped.after.whole_free_leaves == 1
    assert len({m.lease for m in full.moves}) == len(full.moves) == 3
    assert full.after.whole_free_leaves == 3


def test_counts_of_a_snapshot():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    leases = [lease(1, on(nodes, "a1", 1))]

    counts = whole_free_counts(nodes, leases)

    assert (counts.whole_free_leaves, counts.whole_free_nodes, counts.free_gpus) == (1, 3, 31)


def test_a_failed_gpu_is_neither_free_nor_a_target():
    nodes = layout({"L1": ["a1", "a2"], "L2": ["b1", "b2"]})
    broken = [n if n.name != "a2" else NodeView(n.name, n.leaf, n.gpu_model, (
        GpuSlot(n.gpus[0].id, healthy=False, price_micros=PRICE), *n.gpus[1:])) for n in nodes]
    leases = [lease(1, on(nodes, "a1", 8), movable=False), lease(2, on(nodes, "b1", 8))]

    plan = plan_defrag(broken, leases)

    assert plan.before.whole_free_nodes == 1  # b2 only
    assert plan.moves == ()  # a2 has 7 usable GPUs, not 8


def test_a_lease_never_leaves_its_fabric():
    nodes = [NodeView(n.name, n.leaf, n.gpu_model, n.gpus, fabric=n.leaf[0])
             for n in layout({"A1": ["a1", "a2"], "B1": ["b1", "b2"]})]
    leases = [lease(1, on(nodes, "a1", 8), movable=False), lease(2, on(nodes, "b1", 8))]

    assert plan_defrag(nodes, leases).moves == ()  # a2 is free, but in fabric A

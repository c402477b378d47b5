from fabric import services
from fabric.core import generators
from fabric.core.topology import TopologySnapshot
from fabric.models import Fabric
from fabric.selectors import load_snapshot


def test_the_snapshot_read_from_the_database_answers_like_the_one_built_from_the_spec(provider):
    spec = generators.fat_tree(64, 8, tiers=3)
    services.save_fabric(owner=provider, name="ft", spec=spec, source="generator")

    from_db = load_snapshot(Fabric.objects.get(name="ft"))
    from_spec = TopologySnapshot.from_spec(spec)

    assert from_db.nodes == from_spec.nodes
    pairs = [(a, b) for a in from_spec.nodes[::7] for b in from_spec.nodes[::5]]
    assert [from_db.hops(a, b) for a, b in pairs] == [from_spec.hops(a, b) for a, b in pairs]
    assert [from_db.lowest_common_level(a, b) for a, b in pairs] == [
        from_spec.lowest_common_level(a, b) for a, b in pairs
    ]
    leaf_a, leaf_b = from_spec.domains("leaf")[:2]
    assert from_db.bandwidth_between(("leaf", leaf_a), ("leaf", leaf_b)) == \
        from_spec.bandwidth_between(("leaf", leaf_a), ("leaf", leaf_b))


def test_a_torus_snapshot_from_the_database_keeps_wrap_around_hops(provider):
    spec = generators.torus(4, 4, 4)
    services.save_fabric(owner=provider, name="t", spec=spec, source="generator")

    from_db = load_snapshot(Fabric.objects.get(name="t"))
    from_spec = TopologySnapshot.from_spec(spec)

    first, last = from_spec.nodes[0], from_spec.nodes[-1]
    assert from_db.hops(first, last) == from_spec.hops(first, last)

from fabric.core.levels import NodeDomains
from web.fabric_picture import NodeState, fill_of, layout


def test_nodes_sit_in_their_leaves_inside_their_spine_blocks_in_natural_order():
    domains = {f"n{i}": NodeDomains(leaf=f"leaf{i // 2}", spine=f"spine{i // 4}")
               for i in range(10)}

    spines, width, height = layout(domains, {})

    assert [s.name for s in spines] == ["spine0", "spine1", "spine2"]
    assert [leaf.name for leaf in spines[0].children] == ["leaf0", "leaf1"]
    assert [m.name for m in spines[0].children[0].children] == ["n0", "n1"]
    assert all(s.width == width for s in spines) and height > 0
    for spine in spines:
        for leaf in spine.children:
            assert spine.y < leaf.y and leaf.y + leaf.height <= spine.y + spine.height
            for mark in leaf.children:
                assert leaf.x <= mark.x < leaf.x + leaf.width


def test_leaves_wrap_onto_a_new_row_when_the_picture_is_full():
    domains = {f"n{i}": NodeDomains(leaf=f"leaf{i // 8}", spine="s") for i in range(80)}

    spines, width, _ = layout(domains, {}, width=600)

    rows = {leaf.y for leaf in spines[0].children}
    assert len(rows) > 1 and width <= 600


def test_a_node_is_coloured_by_how_many_of_its_gpus_are_leased():
    def state(leased, available=True):
        return NodeState(gpus=8, leased=leased, available=available, title="")

    assert fill_of(state(0)) == "free"
    assert fill_of(state(3)) == "partial"
    assert fill_of(state(8)) == "full"
    assert fill_of(state(0, available=False)) == "out"
    assert fill_of(None) == "unregistered"

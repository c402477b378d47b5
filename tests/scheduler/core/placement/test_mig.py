"""MIG: legal starts, profile tables per model, order-independent search."""

import itertools

import pytest

from scheduler.core.placement import MIG_MODELS, InvalidInput, MigInstance, place_mig

PROFILE_TABLE = {
    # model: [(name, slices, memory_mib, legal starts)], smallest first
    "A100-40GB": [
        ("1g.5gb", 1, 5 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.10gb", 2, 10 * 1024, (0, 2, 4, 6)),
        ("2g.10gb", 2, 10 * 1024, (0, 2, 4)),
        ("3g.20gb", 4, 20 * 1024, (0, 4)),
        ("4g.20gb", 4, 20 * 1024, (0,)),
        ("7g.40gb", 8, 40 * 1024, (0,)),
    ],
    "A100-80GB": [
        ("1g.10gb", 1, 10 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, 20 * 1024, (0, 2, 4, 6)),
        ("2g.20gb", 2, 20 * 1024, (0, 2, 4)),
        ("3g.40gb", 4, 40 * 1024, (0, 4)),
        ("4g.40gb", 4, 40 * 1024, (0,)),
        ("7g.80gb", 8, 80 * 1024, (0,)),
    ],
    "H100-80GB": [
        ("1g.10gb", 1, 10 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, 20 * 1024, (0, 2, 4, 6)),
        ("2g.20gb", 2, 20 * 1024, (0, 2, 4)),
        ("3g.40gb", 4, 40 * 1024, (0, 4)),
        ("4g.40gb", 4, 40 * 1024, (0,)),
        ("7g.80gb", 8, 80 * 1024, (0,)),
    ],
    "H200-141GB": [
        ("1g.18gb", 1, 18 * 1024, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.35gb", 2, 35 * 1024, (0, 2, 4, 6)),
        ("2g.35gb", 2, 35 * 1024, (0, 2, 4)),
        ("3g.71gb", 4, 71 * 1024, (0, 4)),
        ("4g.71gb", 4, 71 * 1024, (0,)),
        ("7g.141gb", 8, 141 * 1024, (0,)),
    ],
}


def names(model):
    return [row[0] for row in PROFILE_TABLE[model]]


def instances(placement):
    assert placement.placed, placement.reason
    return [(i.profile, i.start) for i in placement.instances]


@pytest.mark.parametrize("model", sorted(PROFILE_TABLE))
def test_each_model_has_the_guides_profiles_slices_and_starts(model):
    table = [(p.name, p.slices, p.memory_mib, p.starts) for p in MIG_MODELS[model].values()]
    assert table == PROFILE_TABLE[model]


@pytest.mark.parametrize("model", sorted(PROFILE_TABLE))
def test_each_profile_can_start_only_at_its_legal_starts(model):
    for name, _, _, starts in PROFILE_TABLE[model]:
        for start in range(8):
            occupied = [MigInstance(name, start)]
            if start in starts:
                assert place_mig(model, occupied, []).placed
            else:
                with pytest.raises(InvalidInput) as error:
                    place_mig(model, occupied, [])
                assert error.value.field == "occupied[0].start"


@pytest.mark.parametrize("model", sorted(PROFILE_TABLE))
def test_layouts_that_fill_a_gpu(model):
    one, one_double, two, three, four, seven = names(model)
    assert instances(place_mig(model, [], [seven])) == [(seven, 0)]
    assert instances(place_mig(model, [], [three, three])) == [(three, 0), (three, 4)]
    assert instances(place_mig(model, [], [three, four])) == [(three, 4), (four, 0)]
    assert instances(place_mig(model, [], [one] * 7)) == [(one, s) for s in range(7)]
    assert instances(place_mig(model, [], [two, two, two, one])) == [
        (two, 0), (two, 2), (two, 4), (one, 6)]
    assert instances(place_mig(model, [], [one_double] * 4)) == [
        (one_double, s) for s in (0, 2, 4, 6)]


@pytest.mark.parametrize("model", sorted(PROFILE_TABLE))
def test_sets_that_do_not_fit_are_refused(model):
    one, one_double, two, three, four, seven = names(model)
    for request in ([one] * 8, [four, four], [two] * 4, [seven, one], [three, three, one]):
        placement = place_mig(model, [], request)
        assert not placement.placed
        assert placement.reason.endswith("do not fit beside the occupied instances")
    assert not place_mig(model, [MigInstance(one, 3)], [seven]).placed


@pytest.mark.parametrize("model", sorted(PROFILE_TABLE))
def test_memory_requests_take_the_smallest_profile_with_that_memory(model):
    rows = PROFILE_TABLE[model]
    smallest = rows[0]
    assert instances(place_mig(model, [], [{"memory_mib": 1}])) == [(smallest[0], 0)]
    # just above the smallest: the double-memory 1g wins over the 2g of equal memory
    above = place_mig(model, [], [{"memory_mib": smallest[2] + 1}])
    assert instances(above) == [(rows[1][0], 0)]
    whole = place_mig(model, [], [{"memory_mib": rows[-1][2]}])
    assert instances(whole) == [(rows[-1][0], 0)]
    too_big = place_mig(model, [], [{"memory_mib": rows[-1][2] + 1}])
    assert not too_big.placed
    assert too_big.reason == f"no profile has {rows[-1][2] + 1} MiB on {model}"


def test_the_issue_example_places_beside_an_occupied_3g():
    placement = place_mig("A100-40GB", [MigInstance("3g.20gb", 4)],
                          ["2g.10gb", {"memory_mib": 5000}])
    assert instances(placement) == [("2g.10gb", 0), ("1g.5gb", 2)]


def test_search_finds_a_fit_that_first_come_first_served_would_miss():
    # asked in this order, greedy puts 1g at 0 and then the 4g (start 0 only) cannot fit
    placement = place_mig("A100-40GB", [], ["1g.5gb", "4g.20gb", "2g.10gb"])
    assert instances(placement) == [("1g.5gb", 6), ("4g.20gb", 0), ("2g.10gb", 4)]


def test_any_order_of_the_same_request_gets_the_same_instances():
    request = ["1g.5gb", "2g.10gb", "1g.10gb", "1g.5gb"]
    occupied = [MigInstance("1g.5gb", 3)]
    answers = {
        tuple(sorted(instances(place_mig("A100-40GB", occupied, list(order)))))
        for order in itertools.permutations(request)
    }
    # 7 of 8 slices used whatever the layout; the first layout in canonical search order
    assert answers == {(("1g.10gb", 0), ("1g.5gb", 2), ("1g.5gb", 6), ("2g.10gb", 4))}


def test_among_fitting_layouts_the_largest_free_region_is_kept():
    # a 1g beside an occupied 1g at 0: start 1 leaves 6 contiguous slices (2-7); start 6
    # would leave 1-5 and 7, a region of only 5
    placement = place_mig("H100-80GB", [MigInstance("1g.10gb", 0)], ["1g.10gb"])
    assert instances(placement) == [("1g.10gb", 1)]
    # two 1g beside a 3g at 0: packed at 4 and 5 leaves 6-7 free, a region of 2
    placement = place_mig("H100-80GB", [MigInstance("3g.40gb", 0)], ["1g.10gb", "1g.10gb"])
    assert instances(placement) == [("1g.10gb", 4), ("1g.10gb", 5)]


@pytest.mark.parametrize(
    "model, occupied, request_, field",
    [
        ("A100-16GB", [], ["1g.5gb"], "model"),
        ("A100-40GB", [], ["1g.18gb"], "request[0]"),
        ("A100-40GB", [], [{"memory_mib": -5}], "request[0].memory_mib"),
        ("A100-40GB", [], [42], "request[0]"),
        ("A100-40GB", [MigInstance("9g.99gb", 0)], [], "occupied[0].profile"),
        ("A100-40GB", [MigInstance("3g.20gb", 0), MigInstance("2g.10gb", 2)], [], "occupied[1]"),
    ],
)
def test_malformed_mig_input_names_the_field(model, occupied, request_, field):
    with pytest.raises(InvalidInput) as error:
        place_mig(model, occupied, request_)
    assert error.value.field == field

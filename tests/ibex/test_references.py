import pytest

from ibex.references import lease_id_of, lease_ref


def test_a_lease_ref_names_the_lease_and_reads_back():
    assert lease_ref(42) == "L-42"
    assert lease_id_of(lease_ref(42)) == 42


@pytest.mark.parametrize("ref", ["lease-1", "L-", "L-x", "L42", "crash-payout-1"])
def test_other_refs_name_no_lease(ref):
    assert lease_id_of(ref) is None

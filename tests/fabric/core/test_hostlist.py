import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.core.errors import HostlistError
from fabric.core.hostlist import compress_hostlist, expand_hostlist, natural_sorted


def test_expand_keeps_zero_padding_and_single_values():
    assert expand_hostlist("node[01-04,07]") == ["node01", "node02", "node03", "node04", "node07"]


def test_expand_takes_width_from_the_lower_bound():
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]


def test_expand_splits_top_level_commas_only():
    assert expand_hostlist("a1,b[1-2],c") == ["a1", "b1", "b2", "c"]


def test_expand_multiplies_several_bracket_groups():
    assert expand_hostlist("rack[1-2]-node[01-02]") == [
        "rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02",
    ]


def test_expand_of_empty_text_is_empty():
    assert expand_hostlist("") == []


@pytest.mark.parametrize(
    "expression",
    ["node[01-04", "node01-04]", "node[04-01]", "node[a-b]", "node[]", "node[1-]", "a,,b",
     "node[1[2]]", "node 01"],
)
def test_expand_rejects_malformed_expressions(expression):
    with pytest.raises(HostlistError):
        expand_hostlist(expression)


@pytest.mark.parametrize("expression", ["n[1-\u00b2]", "n[\u0663-4]", "n[1-" + "9" * 5000 + "]"])
def test_expand_rejects_bounds_int_cannot_read(expression):
    # found by the importer fuzzer (2026-11-30): these raised ValueError, not HostlistError
    with pytest.raises(HostlistError, match="bad range"):
        expand_hostlist(expression)


def test_expand_refuses_absurd_ranges():
    with pytest.raises(HostlistError, match="too large"):
        expand_hostlist("n[0-99999999]")


def test_compress_folds_runs_and_keeps_padding():
    names = ["node01", "node02", "node03", "node04", "node07"]
    assert compress_hostlist(names) == "node[01-04,07]"


def test_compress_lets_unpadded_numbers_join_a_padded_run():
    assert compress_hostlist(["node08", "node09", "node10"]) == "node[08-10]"


def test_compress_sorts_naturally_and_drops_duplicates():
    assert compress_hostlist(["n10", "n9", "n8", "n9", "gpu"]) == "gpu,n[8-10]"


def test_compress_only_folds_the_trailing_number():
    assert compress_hostlist(["rack1-node01", "rack1-node02", "rack2-node01"]) == (
        "rack1-node[01-02],rack2-node01"
    )


def test_compress_rejects_names_that_cannot_appear_in_a_hostlist():
    with pytest.raises(HostlistError):
        compress_hostlist(["node[1]"])


def test_natural_sort_puts_node2_before_node10():
    assert natural_sorted(["node10", "node2", "node1"]) == ["node1", "node2", "node10"]


_names = st.builds(
    lambda prefix, number, width: f"{prefix}{number:0{width}d}",
    st.sampled_from(["node", "gpu-", "r1n"]),
    st.integers(0, 300),
    st.integers(1, 4),
) | st.sampled_from(["login", "head-a"])


@settings(max_examples=150, deadline=None)
@given(st.lists(_names, max_size=40))
def test_expand_inverts_compress(names):
    expanded = expand_hostlist(compress_hostlist(names))
    assert sorted(expanded) == sorted(set(names))
    assert len(expanded) == len(set(expanded))


def test_a_few_bytes_cannot_ask_for_millions_of_hosts():
    with pytest.raises(HostlistError, match="too large"):
        expand_hostlist("n[1-4999999]")
    with pytest.raises(HostlistError, match="too many names"):
        expand_hostlist("a[1-1000]-b[1-1000]")

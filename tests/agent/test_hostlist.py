import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.hostlist import expand_hostlist


@pytest.mark.parametrize(("text", "hosts"), [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[8-11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("a[1-2]-b[01-02]", ["a1-b01", "a1-b02", "a2-b01", "a2-b02"]),
    ("gpu[01-02,07]", ["gpu01", "gpu02", "gpu07"]),
    ("gpu[01-02],login1, gpu[02-03]", ["gpu01", "gpu02", "login1", "gpu03"]),
    ("rack[1]-n[3]", ["rack1-n3"]),
])
def test_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(("text", "problem"), [
    ("gpu[01-", "unbalanced '['"),
    ("gpu01]", "unbalanced ']'"),
    ("gpu[a-b]", "bad range"),
    ("gpu[03-01]", "runs backwards"),
    ("gpu01,,gpu02", "empty host name"),
    ("gpu[[1-2]]", "unbalanced '['"),
])
def test_malformed_lists_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[")):
        expand_hostlist(text)


def test_sixty_four_hosts():
    hosts = expand_hostlist("gpu[01-64]")
    assert len(hosts) == 64 and hosts[0] == "gpu01" and hosts[-1] == "gpu64"


@given(st.integers(0, 500), st.integers(0, 50), st.integers(1, 4))
def test_a_range_has_one_host_per_number(first, extra, width):
    last = first + extra
    hosts = expand_hostlist(f"n[{str(first).zfill(width)}-{last}]")
    assert len(hosts) == extra + 1
    assert [int(host[1:]) for host in hosts] == list(range(first, last + 1))

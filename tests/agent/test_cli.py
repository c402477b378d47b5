import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.cli import hostnames_of


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
def test_hosts_option(text, hosts):
    assert hostnames_of(text) == hosts


@pytest.mark.parametrize(("text", "problem"), [
    ("gpu[01-", "unclosed '['"),
    ("gpu01]", "unbalanced ']'"),
    ("gpu[a-b]", "bad range"),
    ("gpu[03-01]", "descending range"),
    ("gpu01,,gpu02", "empty name"),
    ("gpu[[1-2]]", "nested '['"),
    ("gpu 01", "whitespace"),
    ("n[1-999999999]", "too large"),
])
def test_malformed_hosts_say_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem.replace("[", r"\[")):
        hostnames_of(text)


def test_sixty_four_hosts():
    hosts = hostnames_of("gpu[01-64]")
    assert len(hosts) == 64 and hosts[0] == "gpu01" and hosts[-1] == "gpu64"


@given(st.integers(0, 500), st.integers(0, 50), st.integers(1, 4))
def test_a_range_has_one_host_per_number(first, extra, width):
    last = first + extra
    hosts = hostnames_of(f"n[{str(first).zfill(width)}-{last}]")
    assert len(hosts) == extra + 1
    assert [int(host[1:]) for host in hosts] == list(range(first, last + 1))


def test_the_agent_loads_without_django():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, agent.cli; print('django' in sys.modules)"],
        capture_output=True, text=True, check=True,
    )
    assert loaded.stdout.strip() == "False"

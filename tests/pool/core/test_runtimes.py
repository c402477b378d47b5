"""Which node runtimes can run what a lease asks (pool.core.workloads.runtimes_for)."""

import pytest

from pool.core.workloads import RUNTIMES, runtimes_field, runtimes_for, why_runtimes

KEY = "ssh-ed25519 AAAA a@b"


def test_a_lease_asking_nothing_of_the_agent_may_use_any_node_but_a_slurm_one():
    runtimes = runtimes_for(None, [])
    assert runtimes == {"none", "process", "ssh"}
    assert runtimes == set(RUNTIMES) - {"slurm"}
    assert why_runtimes(runtimes) == (
        "nodes on a Slurm fabric need a slurm_account on the order (the Slurm account their "
        "reservation is made for)")


def test_a_lease_naming_a_slurm_account_may_use_any_node():
    # an ordinary node simply ignores the account
    assert runtimes_for(None, [], "physics") is None


def test_a_workload_needs_a_runtime_that_runs_commands():
    runtimes = runtimes_for({"command": ["python3", "train.py"]}, [])
    assert runtimes == {"process", "ssh"}
    assert "runtime process or ssh" in why_runtimes(runtimes)


def test_ssh_keys_need_the_ssh_runtime_with_or_without_a_workload():
    assert runtimes_for(None, [KEY]) == {"ssh"}
    assert runtimes_for({"command": ["true"]}, [KEY]) == {"ssh"}
    assert "runtime ssh" in why_runtimes(frozenset({"ssh"}))


@pytest.mark.parametrize("workload, ssh_keys, runtimes", [
    ({"command": ["true"]}, [], {"process", "ssh"}),
    (None, [KEY], {"ssh"}),
])
def test_a_slurm_account_does_not_let_a_workload_or_keys_onto_slurm_nodes(workload, ssh_keys,
                                                                          runtimes):
    assert runtimes_for(workload, ssh_keys, "physics") == runtimes


@pytest.mark.parametrize("workload, ssh_keys, field", [
    (None, [], "slurm_account"),
    ({"command": ["true"]}, [], "workload"),
    ({"command": ["true"]}, [KEY], "ssh_keys"),
    (None, [KEY], "ssh_keys"),
])
def test_a_refusal_names_the_field_that_kept_the_order_off_the_other_nodes(workload, ssh_keys,
                                                                           field):
    assert runtimes_field(workload, ssh_keys) == field

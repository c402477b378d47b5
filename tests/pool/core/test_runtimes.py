"""Which node runtimes can run what a lease asks (pool.core.workloads.runtimes_for)."""

from pool.core.workloads import runtimes_for, why_runtimes


def test_a_lease_asking_nothing_of_the_agent_may_use_any_node():
    assert runtimes_for(None, []) is None


def test_a_workload_needs_a_runtime_that_runs_commands():
    runtimes = runtimes_for({"command": ["python3", "train.py"]}, [])
    assert runtimes == {"process", "ssh"}
    assert "runtime process or ssh" in why_runtimes(runtimes)


def test_ssh_keys_need_the_ssh_runtime_with_or_without_a_workload():
    assert runtimes_for(None, ["ssh-ed25519 AAAA a@b"]) == {"ssh"}
    assert runtimes_for({"command": ["true"]}, ["ssh-ed25519 AAAA a@b"]) == {"ssh"}
    assert "runtime ssh" in why_runtimes(frozenset({"ssh"}))

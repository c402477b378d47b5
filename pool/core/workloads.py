"""What a lease's nodes run, over plain data (docs/workloads.md): ranks, the launch each rank is
sent, the lease's workload state from its ranks' states, and the SSH line a tenant is shown.

    ranks_in_order(hostnames) -> dict[hostname, rank]     0..n-1 in hostname order
    launch_for_rank(work, ...) -> dict                     the `launch` of a start action
    workload_state(rank_states) -> str                     waiting | running | exited | failed | stopped
    ssh_line(user, address, port) -> str                   "ssh -p 2222 ibex-l42@10.0.0.5"
"""

from collections.abc import Iterable

# what an agent reports for one rank
RANK_STATES = ("running", "exited", "failed", "stopped")
WORKLOAD_STATES = ("waiting", *RANK_STATES)
# a rank that reports one of these has ended: a new report cannot bring it back to running
ENDED_RANK_STATES = frozenset({"exited", "failed", "stopped"})


def ranks_in_order(hostnames: Iterable[str]) -> dict[str, int]:
    """The lease's node order is its nodes' hostname order: rank 0 is the first."""
    return {name: rank for rank, name in enumerate(sorted(set(hostnames)))}


def launch_for_rank(work: dict, *, lease_ref: str, generation: int, node_rank: int,
                    nnodes: int, node_addrs: list[str], master_port: int | None) -> dict:
    """The `launch` object of a start action: the tenant's work, and where this rank stands."""
    return {
        "lease_id": lease_id_of(lease_ref),
        "user": lease_account(lease_ref),
        "generation": generation,
        "command": work.get("command"),
        "env": dict(work.get("env") or {}),
        "workdir": work.get("workdir") or "",
        "ssh_keys": list(work.get("ssh_keys") or []),
        "node_rank": node_rank,
        "nnodes": nnodes,
        "node_addrs": list(node_addrs),
        "master_addr": node_addrs[0] if node_addrs else "",
        "master_port": master_port,
    }


def workload_state(rank_states: list[str]) -> str:
    """The lease's workload state from its ranks' (an unreported rank is ""): failed if one
    failed, exited when all exited, stopped when one was stopped and none runs, running while
    one runs, else waiting."""
    if not rank_states:
        return "waiting"
    if "failed" in rank_states:
        return "failed"
    if all(state == "exited" for state in rank_states):
        return "exited"
    if "running" in rank_states:
        return "running"
    if "stopped" in rank_states:
        return "stopped"
    return "waiting"


def ssh_line(user: str, address: str, port: int) -> str:
    return f"ssh -p {port} {user}@{address}"


def lease_account(lease_ref: str) -> str:
    """The Unix account an agent creates for a lease (docs/workloads.md): `ibex-l<lease id>`."""
    return f"ibex-l{lease_id_of(lease_ref) or lease_ref}"


def lease_id_of(ref: str) -> str:
    """The lease id in its reference `L-<id>` (the pool's name for a lease), as text."""
    prefix, _, number = ref.partition("-")
    return number if prefix == "L" and number.isdigit() else ref

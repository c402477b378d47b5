"""What a lease's nodes run, over plain data (docs/workloads.md): ranks, the launch each rank is
sent, the lease's workload state from its ranks' states, and the SSH line a tenant is shown.

    ranks_in_order(hostnames) -> dict[hostname, rank]     0..n-1 in hostname order
    launch_for_rank(work, ...) -> dict                     the `launch` of a start action
    workload_state(rank_states) -> str                     waiting | running | exited | failed | stopped
    ssh_line(user, address, port) -> str                   "ssh -p 2222 ibex-l42@10.0.0.5"
    reservation_name(lease_ref) -> str                     "ibex-lease-42", its Slurm reservation
    srun_line(lease_ref, account) -> str                   "srun --reservation=ibex-lease-42 -A x"
    runtimes_for(workload, ssh_keys, slurm_account="")     the node runtimes that can run it
        -> frozenset | None                                (None: any node)
    runtimes_field(workload, ssh_keys) -> str              the order field a refusal names
    why_runtimes(runtimes) -> str                          why other nodes cannot
"""

from collections.abc import Iterable

# what an agent reports for one rank
RANK_STATES = ("running", "exited", "failed", "stopped")
WORKLOAD_STATES = ("waiting", *RANK_STATES)
# a rank that reports one of these has ended: a new report cannot bring it back to running
ENDED_RANK_STATES = frozenset({"exited", "failed", "stopped"})

# what a node's agent can do for a lease (`pool.models.Node.Runtime`, reported by heartbeats)
SLURM = "slurm"  # a node of a Slurm cluster, registered by its gateway (docs/slurm.md)
RUNTIMES = ("none", "process", "ssh", SLURM)
RUNS_COMMANDS = frozenset({"process", "ssh"})
RUNS_SSH = frozenset({"ssh"})
NOT_SLURM = frozenset(RUNTIMES) - {SLURM}
_WHY = {
    RUNS_COMMANDS: "a workload needs nodes whose agent runs commands (runtime process or ssh)",
    RUNS_SSH: "SSH keys need nodes whose agent runs SSH (runtime ssh)",
    NOT_SLURM: "nodes on a Slurm fabric need a slurm_account on the order (the Slurm account "
               "their reservation is made for)",
}


def ranks_in_order(hostnames: Iterable[str]) -> dict[str, int]:
    """The lease's node order is its nodes' hostname order: rank 0 is the first."""
    return {name: rank for rank, name in enumerate(sorted(set(hostnames)))}


def launch_for_rank(work: dict, *, lease_ref: str, generation: int, node_rank: int,
                    nnodes: int, node_addrs: list[str], master_port: int | None,
                    ib_pkey: str | None = None) -> dict:
    """The `launch` object of a start action: the tenant's work, and where this rank stands
    (`ib_pkey`: its InfiniBand partition's P_Key, `0x1a2b`, None on one node)."""
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
        "ib_pkey": ib_pkey,
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


def reservation_name(lease_ref: str) -> str:
    """The Slurm reservation a Slurm gateway holds for a lease (docs/slurm.md)."""
    return f"ibex-lease-{lease_id_of(lease_ref)}"


def srun_line(lease_ref: str, account: str) -> str:
    return f"srun --reservation={reservation_name(lease_ref)} -A {account}"


def lease_account(lease_ref: str) -> str:
    """The Unix account an agent creates for a lease (docs/workloads.md): `ibex-l<lease id>`."""
    return f"ibex-l{lease_id_of(lease_ref) or lease_ref}"


def lease_id_of(ref: str) -> str:
    """The lease id in its reference `L-<id>` (the pool's name for a lease), as text."""
    prefix, _, number = ref.partition("-")
    return number if prefix == "L" and number.isdigit() else ref


def runtimes_for(workload: dict | None, ssh_keys: list | None,
                 slurm_account: str = "") -> frozenset[str] | None:
    """The node runtimes a lease asking for this may be placed on; None: any node. The one
    rule every placement applies: orders, auctions, pools, re-placement and moves.

    A Slurm node is handed over as a reservation for a Slurm account, so it takes only leases
    that name one; such a lease may also go on any other node, which ignores the account. A
    workload or SSH keys need an agent that runs them, which a Slurm node has not."""
    if ssh_keys:
        return RUNS_SSH  # an ssh runtime also runs the command
    if workload:
        return RUNS_COMMANDS
    if slurm_account:
        return None
    return NOT_SLURM


def runtimes_field(workload: dict | None, ssh_keys: list | None) -> str:
    """The order field that `runtimes_for` restricted the nodes for, which a refusal names:
    ssh_keys, workload, or else the slurm_account the order did not give."""
    if ssh_keys:
        return "ssh_keys"
    return "workload" if workload else "slurm_account"


def why_runtimes(runtimes: frozenset[str]) -> str:
    """Why a lease restricted to `runtimes` cannot go on other nodes, for refusal reasons."""
    return _WHY.get(runtimes) or f"it needs nodes whose runtime is {' or '.join(sorted(runtimes))}"

"""The `launch` of a `start` action and the environment a lease's command sees.

Pure: no processes, no files. The table of variables is docs/workloads.md's launch contract;
the tenant's `env` comes first and the contract's variables overwrite it, so a tenant cannot
point NCCL at another lease's GPUs or fake its rank.
"""

import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

from agent.accounts import lease_id
from agent.ibports import IbPort, pkey_index

# the PATH of a lease account, as a login shell on Debian/Ubuntu would set it
ACCOUNT_PATH = "/usr/local/bin:/usr/bin:/bin"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PKEY = re.compile(r"^0x[0-9a-f]{4}$")


@dataclass(frozen=True)
class Launch:
    generation: int
    command: list[str] | None  # argv; None when the tenant gave only SSH keys
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = ""  # relative to the lease's home
    ssh_keys: list[str] = field(default_factory=list)
    node_rank: int = 0
    nnodes: int = 1
    node_addrs: list[str] = field(default_factory=list)
    master_addr: str | None = None
    master_port: int | None = None  # None on rank 0: its agent picks one
    ib_pkey: str | None = None  # the lease's InfiniBand partition (0x1a2b); None on one node

    def as_dict(self) -> dict:
        return asdict(self)


def parse_launch(data: dict) -> Launch:
    """A launch from the server's JSON; TypeError/ValueError/KeyError if it is malformed."""
    command = data.get("command")
    if command is not None:
        command = [_text(arg) for arg in _list(command)]
        if not command or not command[0]:
            raise ValueError("empty command")
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise TypeError("env is not an object")
    env = {_text(name): _text(value) for name, value in env.items()}
    if any(not _ENV_NAME.match(name) for name in env):
        raise ValueError("bad env name")
    workdir = _text(data.get("workdir") or "")
    path = PurePosixPath(workdir)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError("workdir leaves the home")
    master_port = data.get("master_port")
    ib_pkey = data.get("ib_pkey")
    if ib_pkey is not None and not _PKEY.match(_text(ib_pkey)):
        raise ValueError("bad ib_pkey")
    return Launch(
        generation=int(data["generation"]),
        command=command,
        env=env,
        workdir=workdir,
        ssh_keys=[_text(key) for key in _list(data.get("ssh_keys") or [])],
        node_rank=int(data.get("node_rank") or 0),
        nnodes=int(data.get("nnodes") or 1),
        node_addrs=[_text(addr) for addr in _list(data.get("node_addrs") or [])],
        master_addr=_text(data["master_addr"]) if data.get("master_addr") else None,
        master_port=int(master_port) if master_port is not None else None,
        ib_pkey=ib_pkey,
    )


def _list(value: object) -> list:
    if not isinstance(value, list):
        raise TypeError("expected a list")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or "\0" in value:
        raise TypeError("expected a string without NUL")
    return value


def launch_env(
    lease: str,
    launch: Launch,
    gpus: list[int],
    rails: list[IbPort],
    gpus_on_node: int,
    account: str,
    home: str,
    address: str,
    master_port: int,
    devices: list[dict] | None = None,
    mps_pipe_directory: str | None = None,
) -> dict[str, str]:
    """Every variable the lease's command (and its SSH logins) sees, tenant's env included.

    `devices`: the lease's GPU parts as the heartbeat reports them (None: whole GPUs); then
    CUDA_VISIBLE_DEVICES names the MIG devices and shared GPUs, and a share sets MPS's limits
    (see `parts_env`)."""
    env = dict(launch.env)
    visible, part_variables = parts_env(gpus, devices or [], mps_pipe_directory)
    env.update({
        "IBEX_LEASE_ID": lease_id(lease),
        "NODE_RANK": str(launch.node_rank),
        "NNODES": str(launch.nnodes),
        "GPUS_PER_NODE": str(len(visible)),
        "MASTER_ADDR": launch.master_addr or address,
        "MASTER_PORT": str(master_port),
        "IBEX_NODE_ADDRS": ",".join(launch.node_addrs or [address]),
        "CUDA_VISIBLE_DEVICES": ",".join(visible),
        "HOME": home,
        "USER": account,
        "LOGNAME": account,
        "PATH": ACCOUNT_PATH,
    })
    if part_variables:  # a share's limits are ours, not the tenant's
        for name in MPS_VARIABLES:
            env.pop(name, None)
        env.update(part_variables)
    if launch.ib_pkey:  # the partition IBEX gave the lease: the tenant cannot name another
        env["IBEX_IB_PKEY"] = launch.ib_pkey
    else:
        env.pop("IBEX_IB_PKEY", None)
    hca = nccl_ib_hca(gpus, rails, gpus_on_node)
    if hca:
        env["NCCL_IB_HCA"] = hca
    else:
        env.pop("NCCL_IB_HCA", None)  # the tenant may not pick HCAs on a node that has none
    index = nccl_ib_pkey(launch.ib_pkey, gpus, rails, gpus_on_node)
    if index is not None:
        env["NCCL_IB_PKEY"] = str(index)
    else:
        env.pop("NCCL_IB_PKEY", None)  # no partition of its own (yet): the tenant names none
    return env


MPS_VARIABLES = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                 "CUDA_MPS_PIPE_DIRECTORY")


def parts_env(gpus: list[int], devices: list[dict],
              mps_pipe_directory: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(CUDA_VISIBLE_DEVICES' entries, MPS variables) for a lease's parts.

    Visible: each part in the order of `parts` (a MIG slice by its `MIG-...` UUID, a share by
    its GPU index), then the leased GPUs no part names, in index order. Shares set
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (share / 10, at least 1; the smallest share where a
    lease has several: MPS takes one percentage per process) and
    CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (`<ordinal>=<memory_mib>M` per shared GPU, the ordinal
    being its position in CUDA_VISIBLE_DEVICES, as the process's CUDA numbers devices), and
    pass on CUDA_MPS_PIPE_DIRECTORY so the process finds the node's MPS control daemon.
    """
    visible: list[str] = []
    limits: list[str] = []
    shares: list[int] = []
    named: set[int] = set()
    for device in devices:
        index = int(device["index"])
        named.add(index)
        entry = str(device.get("uuid") or "") if "mig_profile" in device else str(index)
        if not entry or entry in visible:
            continue
        visible.append(entry)
        if "share" in device:
            shares.append(int(device["share"]))
            limits.append(f"{len(visible) - 1}={int(device['memory_mib'])}M")
    visible += [str(index) for index in sorted(set(gpus) - named)]
    variables: dict[str, str] = {}
    if shares:
        variables["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(shares) // 10))
        variables["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
        if mps_pipe_directory:
            variables["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_directory
    return visible, variables


def unusable_parts(devices: list[dict] | None) -> str:
    """Why a command cannot start on these parts ('' when it can): a MIG slice that was not
    made leaves nothing to run on (never the whole GPU, which other leases' slices share).
    A share that is not enforced still runs, unlimited, as the heartbeat reports."""
    missing = [device for device in devices or [] if "mig_profile" in device and not device.get("uuid")]
    if not missing:
        return ""
    device = missing[0]
    return (f"MIG slice {device['mig_profile']} at slot {device['start']} of GPU {device['index']} "
            f"is not set up: {device.get('error') or 'unknown error'}")


def used_rails(gpus: list[int], rails: list[IbPort], gpus_on_node: int) -> list[IbPort]:
    """The rails of the leased GPUs: GPU i sits on rail i * rails // GPUs."""
    if not rails or not gpus:
        return []
    gpus_on_node = max(gpus_on_node, max(gpus) + 1)
    return [rails[r] for r in sorted({index * len(rails) // gpus_on_node for index in gpus})]


def nccl_ib_pkey(ib_pkey: str | None, gpus: list[int], rails: list[IbPort],
                 gpus_on_node: int) -> int | None:
    """NCCL_IB_PKEY: the index of the lease's P_Key in its rails' P_Key tables (NCCL takes an
    index, not the key). None without a partition, or before OpenSM programmed it on every
    rail the lease uses."""
    if not ib_pkey:
        return None
    return pkey_index(used_rails(gpus, rails, gpus_on_node), int(ib_pkey, 16))


def nccl_ib_hca(gpus: list[int], rails: list[IbPort], gpus_on_node: int) -> str | None:
    """`=mlx5_0:1,mlx5_3:1`: the rails (IB ports in HCA, port order) of the leased GPUs.

    GPU i sits on rail i * rails // GPUs, so eight GPUs on eight rails get one each and eight
    GPUs on four rails share them in pairs. The leading `=` makes NCCL match names exactly.
    """
    used = used_rails(gpus, rails, gpus_on_node)
    if not used:
        return None
    return "=" + ",".join(f"{rail.device}:{rail.port}" for rail in used)


def free_port(address: str) -> int:
    """A TCP port free on `address` now (the kernel's pick), for rank 0's MASTER_PORT.

    Falls back to all addresses when `address` is a name this host cannot bind (e.g. a public
    name behind NAT).
    """
    for host in (address, "0.0.0.0"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.bind((host, 0))
                return probe.getsockname()[1]
        except OSError:
            continue
    raise OSError(f"cannot bind a free port on {address}")

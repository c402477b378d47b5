"""A real Slurm cluster on this one machine: munged, slurmctld and one slurmd per node.

The tests start four nodes in two leaves (`start_cluster()`); `bench/slurm_peer.py` starts
hundreds, in leaves of its own size, with the same function. Debian builds Slurm with
multiple-slurmd support, so every node is one ``slurmd -N <name>`` on its own port, all at
127.0.0.1. Every file (config, state, spool, logs, pids, the munge key and socket) lives in one
temporary directory, and every daemon is stopped by its own process id, so a run never touches
a system Slurm or munge, nor another run's cluster.

GPUs are GRES, and Slurm checks that a GRES ``File=`` exists, so the "GPUs" are character
devices made with ``mknod`` (1:3, the same device as /dev/null) in the temporary directory.
Running it needs root (mknod, SlurmUser=root, munged as root).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from fabric.core.hostlist import compress_hostlist


def node_names(count: int) -> list[str]:
    """``n001`` ... in order; three digits at least, more when the count needs them."""
    width = max(3, len(str(count)))
    return [f"n{i:0{width}d}" for i in range(1, count + 1)]


NODES = node_names(4)
# Two leaf switches under one spine: the smallest tree with a choice of placement in it.
LEAF_SIZE = 2
GPUS_PER_NODE = 8
GPU_TYPE = "h100"
CPUS_PER_NODE = 4
MEMORY_MIB = 2048
START_TIMEOUT_S = 30.0
# On top of START_TIMEOUT_S: every slurmd registering takes a little of two shared cores.
START_TIMEOUT_PER_NODE_S = 0.25
STOP_TIMEOUT_S = 10.0
# Ports the rest of the test set relies on (Django, PostgreSQL, Redis) are never handed out.
_RESERVED_PORTS = {8000, 5432, 6379}

REQUIRED_PROGRAMS = ("munged", "slurmctld", "slurmd", "scontrol", "scancel", "squeue", "sbatch", "sinfo")


def missing_programs() -> list[str]:
    """The Slurm and munge programs this machine lacks (empty when a cluster can start)."""
    search = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    return [p for p in REQUIRED_PROGRAMS if shutil.which(p, path=search) is None]


def _program(name: str) -> str:
    search = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin" + os.pathsep + "/sbin"
    found = shutil.which(name, path=search)
    if found is None:
        raise RuntimeError(f"{name} is not installed")
    return found


def _free_ports(count: int) -> list[int]:
    """Ports free right now. All sockets stay open until every port is chosen, so none repeats."""
    held, ports = [], []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = s.getsockname()[1]
            if port not in _RESERVED_PORTS:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def _port_list(ports: list[int]) -> str:
    """Slurm's Port= list; one entry per node, in node order."""
    return "[" + ",".join(str(p) for p in ports) + "]"


def leaves_of(nodes: list[str], leaf_size: int) -> dict[str, list[str]]:
    """Leaf switch name -> its nodes: ``leaf1`` holds the first `leaf_size` nodes, and so on."""
    return {f"leaf{i // leaf_size + 1}": nodes[i:i + leaf_size]
            for i in range(0, len(nodes), leaf_size)}


def tree_topology(nodes: list[str], leaf_size: int) -> str:
    """topology.conf for topology/tree: leaves of `leaf_size` nodes, all under one ``spine``."""
    leaves = leaves_of(nodes, leaf_size)
    lines = [f"SwitchName={leaf} Nodes={compress_hostlist(members)}"
             for leaf, members in leaves.items()]
    lines.append(f"SwitchName=spine Switches={compress_hostlist(leaves)}")
    return "\n".join(lines) + "\n"


class ClusterError(RuntimeError):
    pass


@dataclass
class SlurmCluster:
    """One cluster in `root`. `leaf_size` nodes per leaf switch; `cpus_per_node` bounds how
    many jobs share a node (each takes a core at least); `extra_config` lines are added to
    slurm.conf before the nodes."""

    root: Path
    nodes: list[str] = field(default_factory=lambda: list(NODES))
    leaf_size: int = LEAF_SIZE
    cpus_per_node: int = CPUS_PER_NODE
    extra_config: str = ""
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment every Slurm command of this cluster runs with (nothing global)."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def scontrol(self, *args: str, timeout: float = 10.0) -> str:
        result = subprocess.run([_program("scontrol"), *args], env=self.env, capture_output=True,
                                text=True, timeout=timeout)
        if result.returncode != 0:
            raise ClusterError(f"scontrol {' '.join(args)} failed ({result.returncode}): "
                               f"{result.stderr.strip()}")
        return result.stdout

    def sbatch(self, *args: str) -> str:
        """Submit a job; its output goes to the cluster's directory, not the current one."""
        result = subprocess.run(
            [_program("sbatch"), "--parsable", f"--chdir={self.root}",
             f"--output={self.root}/log/job-%j.out", *args],
            env=self.env, capture_output=True, text=True, timeout=10)
        if result.returncode != 0:
            raise ClusterError(f"sbatch failed ({result.returncode}): {result.stderr.strip()}")
        return result.stdout.strip().split(";")[0]

    # -- files ------------------------------------------------------------------------------

    def _write_files(self) -> None:
        root = self.root
        for sub in ("etc", "state", "log", "run", "dev", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # munged refuses a socket or key in a directory others can write to.
        os.chmod(root, 0o711)
        os.chmod(root / "munge", 0o700)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for i in range(GPUS_PER_NODE):
            dev = root / "dev" / f"nvidia{i}"
            os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))

        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        names = compress_hostlist(self.nodes)
        self.conf.write_text(f"""\
ClusterName=ibextest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock
# Each node's slurmd reads its own NodeName line, even with a single machine behind them all.
SlurmdParameters=config_overrides
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups: nothing here needs confining, and a container's cgroup tree is one more thing
# that could differ from machine to machine.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
TopologyPlugin=topology/tree
GresTypes=gpu
SlurmctldTimeout=30
SlurmdTimeout=30
{self.extra_config}
NodeName={names} NodeHostname=localhost NodeAddr=127.0.0.1 Port={_port_list(node_ports)} \
CPUs={self.cpus_per_node} RealMemory={MEMORY_MIB} Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE} State=UNKNOWN
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        (root / "etc" / "gres.conf").write_text(
            f"NodeName={names} Name=gpu Type={GPU_TYPE} "
            f"File={root}/dev/nvidia[0-{GPUS_PER_NODE - 1}]\n")
        (root / "etc" / "topology.conf").write_text(tree_topology(self.nodes, self.leaf_size))

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{key}.out", "wb")  # noqa: SIM115 - closed with the run
        self.processes[key] = subprocess.Popen(argv, env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               start_new_session=True)
        log.close()

    def _wait_for(self, what: str, ready, deadline: float) -> None:
        while time.monotonic() < deadline:
            for key, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{key} exited with {proc.returncode} while waiting for "
                                       f"{what}\n{self.logs()}")
            if ready():
                return
            time.sleep(0.1)
        raise ClusterError(f"timed out waiting for {what}\n{self.logs()}")

    def start(self, timeout: float | None = None) -> None:
        if timeout is None:
            timeout = START_TIMEOUT_S + START_TIMEOUT_PER_NODE_S * len(self.nodes)
        deadline = time.monotonic() + timeout
        self._write_files()
        sock = self.root / "munge" / "munge.sock"
        # --force: munged as root in a private directory would otherwise refuse to start.
        self._spawn("munged", [
            _program("munged"), "-F", "--force", f"--socket={sock}",
            f"--key-file={self.root}/munge/munge.key", f"--pid-file={self.root}/run/munged.pid",
            f"--log-file={self.root}/log/munged.log", f"--seed-file={self.root}/munge/seed",
        ])
        self._wait_for("munged's socket", sock.exists, deadline)
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for("slurmctld", self._controller_answers, deadline)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
            self._spawn(f"slurmd-{node}", [_program("slurmd"), "-D", "-N", node,
                                          "-f", str(self.conf)])
        self._wait_for("all nodes IDLE", self._all_idle, deadline)

    def stop_controller(self) -> None:
        """slurmctld alone goes (the nodes and their jobs stay), as in a controller restart."""
        proc = self.processes["slurmctld"]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT_S)

    def start_controller(self, timeout: float = START_TIMEOUT_S) -> None:
        """slurmctld again, from its saved state (reservations and jobs survive)."""
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for("slurmctld", self._controller_answers, time.monotonic() + timeout)

    def _controller_answers(self) -> bool:
        try:
            self.scontrol("ping", timeout=5)
        except (ClusterError, subprocess.TimeoutExpired):
            return False
        return True

    def node_states(self) -> dict[str, str]:
        """Node name -> State= from ``scontrol show nodes -o`` (one line per node)."""
        states = {}
        for line in self.scontrol("show", "nodes", "-o").splitlines():
            fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
            if "NodeName" in fields:
                states[fields["NodeName"]] = fields.get("State", "")
        return states

    def _all_idle(self) -> bool:
        try:
            states = self.node_states()
        except (ClusterError, subprocess.TimeoutExpired):
            return False
        return sorted(states) == sorted(self.nodes) and all(s == "IDLE" for s in states.values())

    def stop(self) -> None:
        """Stop the jobs, then every daemon by its process id: slurmd first, munged last.

        A job's slurmstepd outlives its slurmd, so jobs are cancelled while the controller still
        answers, and whatever is left that runs with this cluster's SLURM_CONF is ended by pid.
        """
        if self.processes:
            self._cancel_jobs()
        order = [k for k in self.processes if k.startswith("slurmd-")]
        order += [k for k in ("slurmctld", "munged") if k in self.processes]
        for key in order:
            proc = self.processes[key]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for key in order:
            proc = self.processes[key]
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=STOP_TIMEOUT_S)
        self.processes.clear()
        self._end_leftovers()

    def _cancel_jobs(self) -> None:
        try:
            subprocess.run([_program("scancel"), "--partition=gpu"], env=self.env,
                           capture_output=True, timeout=10)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline:
                queue = subprocess.run([_program("squeue"), "-h", "-o", "%i"], env=self.env,
                                       capture_output=True, text=True, timeout=10)
                if queue.returncode != 0 or not queue.stdout.strip():
                    return
                time.sleep(0.1)
        except (subprocess.TimeoutExpired, RuntimeError):
            pass

    def own_leftover_pids(self) -> list[int]:
        """Processes still running with this cluster's SLURM_CONF (job steps, their children)."""
        marker = f"SLURM_CONF={self.conf}".encode() + b"\0"
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes() + b"\0"
            except OSError:
                continue
            if b"\0" + marker in b"\0" + environ:
                pids.append(int(entry.name))
        return pids

    def _end_leftovers(self) -> None:
        for pid in self.own_leftover_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def logs(self) -> str:
        """The tail of every log, for a failure message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def start_cluster(base: Path | None = None, nodes: int = len(NODES), leaf_size: int = LEAF_SIZE,
                  cpus_per_node: int = CPUS_PER_NODE, extra_config: str = "") -> SlurmCluster:
    """Start a cluster in a new temporary directory under `base`; stopped again if it fails."""
    root = Path(tempfile.mkdtemp(prefix="ibex-slurm-", dir=base))
    cluster = SlurmCluster(root=root, nodes=node_names(nodes), leaf_size=leaf_size,
                           cpus_per_node=cpus_per_node, extra_config=extra_config)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster

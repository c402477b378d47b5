"""A simulated InfiniBand fabric: ibsim simulating a net file, OpenSM bringing the subnet up
through libumad2sim, and the environment that puts infiniband-diags (and so the fabric agent)
on it. `manage.py fabric_sim` runs one for a fabric of the database, the live tests run small
ones; nothing here touches Django.

Each simulated fabric has its own ibsim socket (`IBSIM_SOCKNAME`) and directory, so fabrics run
side by side. `console()` types a command on ibsim's console (`Unlink "leaf01"[3]`, `ReLink
...`, `PerformanceSet ...`) and returns what ibsim answered once it has taken it.

What was learnt (docs/fabric.md): an ibsim whose stdin reaches end of file spins a core, so its
console stays a pipe and it is stopped with SIGTERM; OpenSM is waited for until `SUBNET UP` is
in its log (`force_log_flush TRUE`); a diagnostic without a simulator hangs instead of failing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
# each program (or library) the simulated fabric needs, and the Debian package that has it
PACKAGE_OF = {
    "ibsim": "ibsim-utils", "opensm": "opensm", "ibnetdiscover": "infiniband-diags",
    "perfquery": "infiniband-diags", "iblinkinfo": "infiniband-diags",
    "ibqueryerrors": "infiniband-diags", "dump_fts": "infiniband-diags",
    str(UMAD2SIM): "libumad2sim0",
}
PACKAGES = "opensm infiniband-diags ibsim-utils libumad2sim0"
SBIN = ":/usr/sbin:/sbin"  # opensm and infiniband-diags live there, often off a user's PATH
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PROMPT = "sim> "
# OpenSM's routing engine for each kind of fabric, as a list OpenSM tries in order (it falls
# back to the next when one fails on the fabric: ftree wants a real fat tree). Measured under
# ibsim: minhop brings a 64-router torus and a 9-group dragonfly up in well under a second.
ROUTING_ENGINES = {
    "fat-tree": "ftree,minhop", "rail-optimised": "ftree,minhop",
    "single-switch": "minhop", "dragonfly": "minhop", "torus": "minhop",
}


def missing_programs() -> list[str]:
    """The programs (and libumad2sim's library) not installed here."""
    path = os.environ.get("PATH", "") + SBIN
    missing = [name for name in PACKAGE_OF if not name.startswith("/")
               and not shutil.which(name, path=path)]
    if not UMAD2SIM.exists():
        missing.append(str(UMAD2SIM))
    return missing


def install_hint(missing: list[str]) -> str:
    """`needs ibsim, opensm: apt-get install ibsim-utils opensm`, for the programs missing."""
    packages = " ".join(dict.fromkeys(PACKAGE_OF[name] for name in missing))
    return f"needs {', '.join(missing)}: apt-get install {packages}"


class SimulatorError(RuntimeError):
    pass


def _die_with_parent() -> None:
    """In a child, before exec: SIGKILL when the process that started it dies, so that a
    supervisor killed without a chance to stop its children leaves no simulator spinning on
    a closed console, no OpenSM and no agent behind. SIGKILL, not SIGTERM: all three would get
    it at once, and an agent or OpenSM told to stop after ibsim has gone waits on the
    simulator. (A diagnostic the agent had in flight is not its child's child of ours: it may
    be left waiting; stop the command with SIGINT or SIGTERM, which stops all in order.)"""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class SimulatedFabric:
    def __init__(self, directory: Path, netfile_text: str, *, opensm: bool = True,
                 routing_engine: str = "ftree", sweep_interval_s: int = 1,
                 bound_to_parent: bool = False):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.netfile = self.dir / "fabric.net"
        self.netfile.write_text(netfile_text)
        self.socket_name = f"ibex-{uuid.uuid4().hex[:10]}"
        self.osm_dir = self.dir / "opensm"
        self.osm_dir.mkdir(exist_ok=True)
        self.opensm_conf = self.osm_dir / "opensm.conf"
        self.opensm_pid_file = self.osm_dir / "opensm.pid"
        self.opensm_log = self.osm_dir / "opensm.log"
        self.want_opensm = opensm
        self.routing_engine = routing_engine
        self.sweep_interval_s = sweep_interval_s
        self.preexec = _die_with_parent if bound_to_parent else None
        self.ibsim: subprocess.Popen | None = None
        self.opensm: subprocess.Popen | None = None
        self.ibsim_log = self.dir / "ibsim.log"

    @property
    def env(self) -> dict[str, str]:
        """The environment that puts a libibumad program on this fabric."""
        env = dict(os.environ)
        env.update(LD_PRELOAD=str(UMAD2SIM), IBSIM_SOCKNAME=self.socket_name,
                   OSM_CACHE_DIR=str(self.osm_dir), OSM_TMP_DIR=str(self.osm_dir))
        env["PATH"] = env.get("PATH", "") + SBIN
        return env

    def start(self) -> SimulatedFabric:
        missing = missing_programs()
        if missing:
            raise SimulatorError(f"the simulated fabric {install_hint(missing)}")
        self.start_ibsim()
        if self.want_opensm:
            self.start_opensm()
        return self

    def start_ibsim(self) -> None:
        # a fresh log: the readiness line of an earlier run must not count
        with self.ibsim_log.open("w") as log:
            # its own session: a Ctrl-C meant for the one who started it does not reach it
            self.ibsim = subprocess.Popen(
                ["ibsim", "-s", str(self.netfile)], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, text=True, env=self.env, cwd=self.dir,
                start_new_session=True, preexec_fn=self.preexec)
        self._wait_for(lambda: "Network simulator ready" in self._ibsim_output(), "ibsim")

    def start_opensm(self) -> None:
        subprocess.run(["opensm", "-c", str(self.opensm_conf)], env=self.env, cwd=self.osm_dir,
                       capture_output=True, timeout=30)
        options = {
            "routing_engine": self.routing_engine, "log_file": str(self.opensm_log),
            "dump_files_dir": str(self.osm_dir) + "/", "force_log_flush": "TRUE",
            "partition_config_file": str(self.osm_dir / "partitions.conf"),
            "qos_policy_file": str(self.osm_dir / "qos-policy.conf"),
            "sweep_interval": str(self.sweep_interval_s),
        }
        lines = []
        for line in self.opensm_conf.read_text().splitlines():
            key = line.split(" ", 1)[0]
            lines.append(f"{key} {options.pop(key)}" if key in options else line)
        lines += [f"{key} {value}" for key, value in options.items()]
        self.opensm_conf.write_text("\n".join(lines) + "\n")
        self.opensm_log.write_text("")  # `SUBNET UP` of an earlier run must not count
        with (self.osm_dir / "opensm.out").open("w") as out:
            self.opensm = subprocess.Popen(
                ["opensm", "-F", str(self.opensm_conf)], stdout=out, stderr=subprocess.STDOUT,
                env=self.env, cwd=self.osm_dir, start_new_session=True, preexec_fn=self.preexec)
        self.opensm_pid_file.write_text(f"{self.opensm.pid}\n")
        self._wait_for(lambda: "SUBNET UP" in self._read(self.opensm_log), "OpenSM")

    def console(self, command: str, timeout: float = 10.0) -> str:
        """Type a command on ibsim's console; what it printed in answer."""
        if self.ibsim is None or self.ibsim.poll() is not None:
            raise SimulatorError("ibsim is not running")
        before = self._ibsim_output()
        self.ibsim.stdin.write(command + "\n")
        self.ibsim.stdin.flush()
        # ibsim prints a new prompt once it has carried the command out
        self._wait_for(lambda: self._ibsim_output().count(PROMPT) > before.count(PROMPT),
                       f"ibsim to take {command!r}", timeout)
        return self._ibsim_output()[len(before):]

    def wait_until_every_cable_is_active(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until OpenSM has brought every cabled port to Active (a relinked cable is Init until
        its next sweep)."""
        def all_active() -> bool:
            out = subprocess.run(["iblinkinfo", "-l"], env=self.env, capture_output=True,
                                 text=True, timeout=timeout).stdout
            linked = [line for line in out.splitlines() if "LinkUp)==>" in line]
            return bool(linked) and all("Active/" in line for line in linked)

        self._wait_for(all_active, "every cable Active", timeout)

    def stop_opensm(self) -> None:
        self.opensm = stop_process(self.opensm)
        self.opensm_pid_file.unlink(missing_ok=True)

    def stop_ibsim(self) -> None:
        # SIGTERM while its console is still open: at end of file it would spin, not stop
        self.ibsim = stop_process(self.ibsim)

    def stop(self) -> None:
        self.stop_opensm()
        self.stop_ibsim()

    def exited(self) -> list[subprocess.Popen]:
        """Its processes that have exited on their own."""
        return [process for process in (self.ibsim, self.opensm)
                if process is not None and process.poll() is not None]

    def logs(self) -> str:
        return (f"--- ibsim\n{self._ibsim_output()[-3000:]}\n--- opensm\n"
                f"{self._read(self.opensm_log)[-3000:]}")

    def _ibsim_output(self) -> str:
        return self._read(self.ibsim_log)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_for(self, ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for process in self.exited():
                raise SimulatorError(f"{what}: a process exited ({process.args[0]}, status "
                                     f"{process.returncode})\n{self.logs()}")
            if time.monotonic() > deadline:
                raise SimulatorError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)


def stop_process(process: subprocess.Popen | None, timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL after `timeout`; closes its stdin afterwards. Always None."""
    if process is None:
        return None
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout)
    if process.stdin:
        try:
            process.stdin.close()
        except OSError:
            pass
    return None

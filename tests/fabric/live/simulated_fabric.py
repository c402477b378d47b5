"""A real simulated InfiniBand fabric for tests: ibsim simulating a net file, OpenSM (routing
engine ftree) bringing the subnet up through libumad2sim, and the environment that lets
infiniband-diags (and so the fabric agent) read it.

Each fabric has its own ibsim socket (`IBSIM_SOCKNAME`) and directory, so fabrics run side by
side. `console()` types a command on ibsim's console (`Unlink "leaf01"[3]`, `ReLink ...`,
`PerformanceSet ...`) and returns once ibsim has taken it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

UMAD2SIM = Path("/usr/lib/x86_64-linux-gnu/umad2sim/libumad2sim.so")
PROGRAMS = ("ibsim", "opensm", "ibnetdiscover", "perfquery", "iblinkinfo", "ibqueryerrors",
            "dump_fts")
PACKAGES = "opensm infiniband-diags ibsim-utils libumad2sim0"
START_TIMEOUT_S = 30.0
PROMPT = "sim> "


def missing_programs() -> list[str]:
    missing = [name for name in PROGRAMS
               if not shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")]
    if not UMAD2SIM.exists():
        missing.append(str(UMAD2SIM))
    return missing


class SimulatorError(RuntimeError):
    pass


class SimulatedFabric:
    def __init__(self, directory: Path, netfile_text: str, *, opensm: bool = True):
        self.dir = directory
        self.netfile = directory / "fabric.net"
        self.netfile.write_text(netfile_text)
        self.socket_name = f"ibex-{uuid.uuid4().hex[:10]}"
        self.osm_dir = directory / "opensm"
        self.osm_dir.mkdir()
        self.opensm_conf = self.osm_dir / "opensm.conf"
        self.opensm_pid_file = self.osm_dir / "opensm.pid"
        self.want_opensm = opensm
        self.ibsim: subprocess.Popen | None = None
        self.opensm: subprocess.Popen | None = None
        self.ibsim_log = directory / "ibsim.log"

    @property
    def env(self) -> dict[str, str]:
        """The environment that puts a libibumad program on this fabric."""
        env = dict(os.environ)
        env.update(LD_PRELOAD=str(UMAD2SIM), IBSIM_SOCKNAME=self.socket_name,
                   OSM_CACHE_DIR=str(self.osm_dir), OSM_TMP_DIR=str(self.osm_dir))
        env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
        return env

    def start(self) -> SimulatedFabric:
        missing = missing_programs()
        if missing:
            raise SimulatorError(f"the simulated fabric needs {', '.join(missing)}: "
                                 f"apt-get install {PACKAGES}")
        self.start_ibsim()
        if self.want_opensm:
            self.start_opensm()
        return self

    def start_ibsim(self) -> None:
        log = self.ibsim_log.open("a")
        self.ibsim = subprocess.Popen(["ibsim", "-s", str(self.netfile)], stdin=subprocess.PIPE,
                                      stdout=log, stderr=subprocess.STDOUT, text=True,
                                      env=self.env, cwd=self.dir)
        log.close()
        self._wait_for(lambda: "Network simulator ready" in self._ibsim_output(), "ibsim")

    def start_opensm(self) -> None:
        subprocess.run(["opensm", "-c", str(self.opensm_conf)], env=self.env, cwd=self.osm_dir,
                       capture_output=True, timeout=30)
        options = {
            "routing_engine": "ftree", "log_file": str(self.osm_dir / "opensm.log"),
            "dump_files_dir": str(self.osm_dir) + "/", "force_log_flush": "TRUE",
            "partition_config_file": str(self.osm_dir / "partitions.conf"),
            "qos_policy_file": str(self.osm_dir / "qos-policy.conf"),
            "sweep_interval": "1",
        }
        lines = []
        for line in self.opensm_conf.read_text().splitlines():
            key = line.split(" ", 1)[0]
            lines.append(f"{key} {options.pop(key)}" if key in options else line)
        lines += [f"{key} {value}" for key, value in options.items()]
        self.opensm_conf.write_text("\n".join(lines) + "\n")
        out = (self.osm_dir / "opensm.out").open("a")
        self.opensm = subprocess.Popen(["opensm", "-F", str(self.opensm_conf)], stdout=out,
                                       stderr=subprocess.STDOUT, env=self.env, cwd=self.osm_dir,
                                       start_new_session=True)
        out.close()
        self.opensm_pid_file.write_text(f"{self.opensm.pid}\n")
        self._wait_for(lambda: "SUBNET UP" in self._read(self.osm_dir / "opensm.log"), "OpenSM")

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
        self.opensm = _stop(self.opensm)

    def stop_ibsim(self) -> None:
        if self.ibsim is not None and self.ibsim.stdin:
            try:
                self.ibsim.stdin.close()
            except OSError:
                pass
        self.ibsim = _stop(self.ibsim)

    def stop(self) -> None:
        self.stop_opensm()
        self.stop_ibsim()

    def logs(self) -> str:
        return (f"--- ibsim\n{self._ibsim_output()[-3000:]}\n--- opensm\n"
                f"{self._read(self.osm_dir / 'opensm.log')[-3000:]}")

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
            for process in (self.ibsim, self.opensm):
                if process is not None and process.poll() is not None:
                    raise SimulatorError(f"{what}: a process exited ({process.args[0]}, status "
                                         f"{process.returncode})\n{self.logs()}")
            if time.monotonic() > deadline:
                raise SimulatorError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)


def _stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return None
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    return None

"""The `process` and `ssh` runtimes: run each lease's command as the lease's own account, give
notice, stop it, remove everything it leaves, and find it again after an agent restart.

One `Workload` per lease, kept in the state file. Its command runs under `agent.supervise`
(a process in its own session that writes the exit code to a status file), so the agent is
never the parent that must wait, and a restarted agent reads the result it missed.
`apply` obeys the heartbeat's actions at once; `tick` (every half second, from its own
thread) notices ends, sends SIGKILL when a deadline passes, and cleans up. Neither waits.

Work dir layout (root-owned): leases/ 711 (homes, 700 each), logs/ 700, run/ 700 (specs and
status files).
"""

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path

import agent
from agent import cgroups
from agent.accounts import account_name, ensure_account, make_dir_as, release_account
from agent.errors import AgentError
from agent.heartbeat import Action, iso_utc
from agent.homes import remove_files_of, write_login_files
from agent.ibports import IbPort
from agent.launch import Launch, free_port, launch_env, parse_launch, unusable_parts
from agent.processes import group_alive, is_supervisor, kill_uid, signal_group

log = logging.getLogger("ibex-agent")

GRACE_S = 30.0  # a stop without grace_s
MOVE_GRACE_S = 10.0  # a new generation replaces the old one
LOG_DRAIN_S = 30.0  # cleanup waits this long at most for the log to be shipped
KINDS = ("none", "process", "ssh")


@dataclass
class Workload:
    """What the runtime runs for one lease (one generation at a time)."""

    lease: str
    generation: int
    launch: dict  # Launch.as_dict()
    gpus: list[int]
    state: str = "running"  # running | exited | failed | stopped | idle (SSH keys only)
    exit_code: int | None = None
    error: str = ""
    started_at: str | None = None
    ended_at: str | None = None
    master_port: int | None = None  # rank 0's pick
    supervisor_pid: int | None = None
    child_pid: int | None = None  # the command; its process group where there is no cgroup
    cgroup: str | None = None
    device_cgroup: str | None = None  # the fence keeping it off the node's other GPUs
    term_sent: bool = False  # the agent asked it to end: its end is `stopped`
    kill_at: float | None = None  # epoch seconds: SIGKILL then if still running
    remove: bool = False  # stopped for good: remove the account once its processes are gone
    ended_seen: float | None = None  # epoch seconds the agent saw it end
    next_launch: dict | None = None  # a new generation, started once this one is gone
    next_gpus: list[int] = field(default_factory=list)
    cleanup_trouble: str = ""  # why removing it failed last time (said once)

    @classmethod
    def from_dict(cls, data: dict) -> "Workload":
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    @property
    def has_command(self) -> bool:
        return self.launch.get("command") is not None

    def report(self) -> dict:
        """The heartbeat's `workloads` entry."""
        return {
            "lease": self.lease, "generation": self.generation, "state": self.state,
            "exit_code": self.exit_code, "started_at": self.started_at, "ended_at": self.ended_at,
            "master_port": self.master_port, "error": self.error,
        }


class Runtime:
    def __init__(
        self,
        kind: str,
        address: str,
        work_dir: Path,
        node_id: int,
        ssh_port: int | None = None,
        records: dict[str, dict] | None = None,
        save: Callable[[], None] = lambda: None,
        rails: Callable[[], list[IbPort]] = list,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown runtime {kind!r}")
        self.kind = kind
        self.address = address
        self.ssh_port = ssh_port if kind == "ssh" else None
        self.work_dir = work_dir
        self.node_id = node_id
        self.leases_dir = work_dir / "leases"
        self.logs_dir = work_dir / "logs"
        self.run_dir = work_dir / "run"
        self.save = save
        self.rails = rails
        self.gpus_on_node = 0  # the node agent keeps it current
        self.lock = threading.RLock()
        self.workloads = _workloads_from(records or {})
        self.supervisors: dict[str, subprocess.Popen] = {}  # ours to reap (not after a restart)
        self.log_drained: Callable[[str], bool] = lambda lease: True
        # the lease's GPU parts (agent.parts.PartsManager.devices_for; None: whole GPUs)
        self.devices_for: Callable[[str], list[dict] | None] = lambda lease: None
        self.mps_pipe_directory: str | None = None
        self._warned: set[str] = set()

    @property
    def runs_commands(self) -> bool:
        return self.kind != "none"

    def descriptor(self) -> dict:
        return {"kind": self.kind, "address": self.address, "ssh_port": self.ssh_port}

    def prepare(self) -> None:
        """Make the work dir; check lease accounts can reach their homes. Root only."""
        if not self.runs_commands:
            return
        if os.geteuid() != 0:
            raise AgentError(f"--runtime {self.kind} needs root (it creates lease accounts)")
        for path, mode in ((self.work_dir, 0o711), (self.leases_dir, 0o711),
                           (self.logs_dir, 0o700), (self.run_dir, 0o700)):
            try:
                path.mkdir(mode=mode, parents=True, exist_ok=True)
                os.chmod(path, mode)
            except OSError as error:
                raise AgentError(f"cannot make {path}: {error.strerror}") from None
        for parent in self.work_dir.resolve().parents:
            if not parent.stat().st_mode & 0o001:
                raise AgentError(f"lease accounts cannot reach their homes: {parent} is not "
                                 f"searchable by others (chmod o+x {parent}, or pick another --work-dir)")

    # the heartbeat's view

    def reports(self) -> list[dict]:
        with self.lock:
            return [w.report() for _, w in sorted(self.workloads.items()) if w.has_command]

    def holds(self, lease: str) -> bool:
        """Whether anything of the lease (a process, its account) may still be on the node."""
        with self.lock:
            return lease in self.workloads

    def tearing_down(self) -> set[str]:
        """Leases stopped by the server whose processes or files are not gone yet."""
        with self.lock:
            return {lease for lease, w in self.workloads.items() if w.remove}

    # actions

    def apply(self, actions: list[Action]) -> bool:
        """Obey the actions; True if a command was launched (news for the server: its
        generation, rank 0's master_port)."""
        with self.lock:
            before = {lease: w.generation for lease, w in self.workloads.items()}
        for action in actions:
            try:
                if action.action == "start" and action.launch is not None:
                    self.start(action.lease, action.gpus, action.launch)
                elif action.action == "notice" and action.until is not None:
                    self.notice(action.lease, action.until)
                elif action.action == "stop":
                    self.stop(action.lease, action.grace_s)
            except AgentError as error:
                log.warning("lease %s: %s", action.lease, error)
        with self.lock:
            return any(before.get(lease) != w.generation for lease, w in self.workloads.items())

    def start(self, lease: str, gpus: list[int], launch: Launch) -> None:
        if not self.runs_commands:
            if lease not in self._warned:
                self._warned.add(lease)
                log.warning("lease %s has a workload, but this agent runs --runtime none; not run", lease)
            return
        with self.lock:
            current = self.workloads.get(lease)
            if current is not None and (current.generation == launch.generation or current.remove):
                return  # the server repeats start until it sees the generation reported
            if current is not None:
                log.info("lease %s: generation %d replaces %d", lease, launch.generation, current.generation)
                current.next_launch, current.next_gpus = launch.as_dict(), list(gpus)
                self._ask_to_end(current, time.time() + MOVE_GRACE_S)
                self.save()
                return
            self._launch(lease, gpus, launch)

    def notice(self, lease: str, until: datetime) -> None:
        with self.lock:
            current = self.workloads.get(lease)
            if current is None:
                return
            log.info("lease %s: notice until %s", lease, iso_utc(until))
            self._ask_to_end(current, until.timestamp())
            self.save()

    def stop(self, lease: str, grace_s: float | None) -> None:
        with self.lock:
            current = self.workloads.get(lease)
            if current is None:
                return
            if not current.remove:
                log.info("lease %s: stopping", lease)
            current.remove = True
            current.next_launch = None
            self._ask_to_end(current, time.time() + (GRACE_S if grace_s is None else grace_s))
            self.save()

    def _ask_to_end(self, w: Workload, kill_at: float) -> None:
        """SIGTERM once; SIGKILL at `kill_at` (the earliest deadline given wins)."""
        if w.state != "running":
            return
        if not w.term_sent:
            w.term_sent = True
            self._signal(w, signal.SIGTERM)
        w.kill_at = min(kill_at, w.kill_at) if w.kill_at else kill_at

    # starting

    def _launch(self, lease: str, gpus: list[int], launch: Launch) -> None:
        w = Workload(lease, launch.generation, launch.as_dict(), list(gpus), started_at=_now())
        if launch.command is None:
            w.state = "idle"
        self.workloads[lease] = w
        try:
            self._prepare_and_spawn(w, launch)
            if launch.command is not None:
                log.info("lease %s: generation %d runs %s as %s", lease, launch.generation,
                         launch.command[0], account_name(lease))
        except (AgentError, OSError) as error:  # OSError: no free port, a full disk, ...
            reason = str(error) if isinstance(error, AgentError) else (error.strerror or str(error)).lower()
            w.state, w.error, w.ended_at, w.ended_seen = "failed", reason, _now(), time.time()
            log.warning("lease %s: cannot start: %s", lease, reason)
        self.save()

    def _prepare_and_spawn(self, w: Workload, launch: Launch) -> None:
        devices = self.devices_for(w.lease)
        if launch.command is not None and (problem := unusable_parts(devices)):
            raise AgentError(problem)
        account = ensure_account(w.lease, self.leases_dir)
        workdir = account.home / launch.workdir if launch.workdir else account.home
        make_dir_as(account, workdir)
        port = launch.master_port
        if port is None and launch.node_rank == 0:
            port = free_port(self.address)
        if launch.node_rank == 0:
            w.master_port = port
        env = launch_env(w.lease, launch, w.gpus, self.rails(), self.gpus_on_node, account.name,
                         str(account.home), self.address, port, devices, self.mps_pipe_directory)
        write_login_files(account, env, workdir, launch.ssh_keys if self.kind == "ssh" else None)
        if launch.command is None:
            return
        cgroup = cgroups.create(f"node{self.node_id}-{account.name}-g{w.generation}")
        spec_path = self._path(w.lease, w.generation, "spec.json")
        status_path = self._path(w.lease, w.generation, "status.json")
        status_path.unlink(missing_ok=True)
        fence = cgroups.fence_gpus(f"node{self.node_id}-{account.name}-g{w.generation}",
                                   w.gpus, self.gpus_on_node)
        w.device_cgroup = str(fence) if fence else None
        spec = {"argv": launch.command, "env": env, "uid": account.uid, "gid": account.gid,
                "workdir": str(workdir), "log": str(self.log_path(w.lease, w.generation)),
                "status": str(status_path), "cgroup": str(cgroup) if cgroup else None,
                "device_cgroup": w.device_cgroup}
        _write_private(spec_path, spec)
        try:
            with open(self._path(w.lease, w.generation, "supervisor.err"), "wb") as errors:
                process = subprocess.Popen(
                    [sys.executable, "-m", "agent.supervise", str(spec_path)],
                    start_new_session=True, cwd="/", env=_supervisor_env(),
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                )
        except OSError as error:
            raise AgentError(f"cannot start the supervisor: {error.strerror}") from None
        self.supervisors[w.lease] = process
        w.supervisor_pid, w.cgroup = process.pid, str(cgroup) if cgroup else None

    def log_path(self, lease: str, generation: int) -> Path:
        return self.logs_dir / f"{lease}.{generation}.log"

    def _path(self, lease: str, generation: int, what: str) -> Path:
        return self.run_dir / f"{lease}.{generation}.{what}"

    # watching

    def tick(self) -> None:
        """Notice ends, enforce SIGKILL deadlines, start a waiting generation, clean up."""
        finished = []
        with self.lock:
            for w in list(self.workloads.values()):
                self._refresh(w)
                if w.state == "running":
                    if w.kill_at is not None and time.time() >= w.kill_at:
                        log.info("lease %s: still running at its deadline; SIGKILL", w.lease)
                        self._signal(w, signal.SIGKILL)
                        w.kill_at = None
                    continue
                if w.next_launch is not None:
                    self._start_next(w)
                elif w.remove and self._log_done(w):
                    finished.append(w)
        # the slow part (kills, a walk of /tmp) without the lock, so heartbeats go on meanwhile;
        # a lease being removed takes no new start, so nothing else touches it
        for w in finished:
            if self._remove_everything(w):
                with self.lock:
                    self.supervisors.pop(w.lease, None)
                    self.workloads.pop(w.lease, None)
                    log.info("lease %s: stopped; account %s and its files removed", w.lease,
                             account_name(w.lease))
                    self.save()

    def _refresh(self, w: Workload) -> None:
        if w.state != "running":
            return
        status = self._status(w)
        w.child_pid = status.get("child_pid", w.child_pid)
        if "exit_code" not in status:
            if self._supervisor_alive(w):
                return
            status = self._status(w)  # it may have written the result just before it went
        if "exit_code" in status:
            self._ended(w, status["exit_code"], status.get("error") or "", status.get("ended_at"))
        else:
            self._ended(w, None, "its supervisor is gone (killed, or the node restarted); "
                        "the result is unknown" + self._supervisor_trouble(w), None)

    def _ended(self, w: Workload, code: int | None, error: str, ended_at: str | None) -> None:
        w.exit_code, w.error, w.ended_at, w.ended_seen = code, error, ended_at or _now(), time.time()
        w.state = "stopped" if w.term_sent else "exited" if code == 0 and not error else "failed"
        w.kill_at = None
        log.info("lease %s: generation %d %s (exit code %s)%s", w.lease, w.generation, w.state,
                 code, f": {error}" if error else "")
        self.save()

    def _status(self, w: Workload) -> dict:
        try:
            return json.loads(self._path(w.lease, w.generation, "status.json").read_text())
        except (OSError, ValueError):
            return {}

    def _supervisor_alive(self, w: Workload) -> bool:
        process = self.supervisors.get(w.lease)
        if process is not None and process.pid == w.supervisor_pid:
            return process.poll() is None  # poll() also reaps it
        return is_supervisor(w.supervisor_pid, self._path(w.lease, w.generation, "spec.json"))

    def _supervisor_trouble(self, w: Workload) -> str:
        try:
            lines = self._path(w.lease, w.generation, "supervisor.err").read_text().strip().splitlines()
        except OSError:
            return ""
        return f" ({lines[-1]})" if lines else ""

    def _signal(self, w: Workload, signum: int) -> None:
        if w.cgroup and Path(w.cgroup).is_dir():
            cgroups.signal_all(Path(w.cgroup), signum)
        else:
            signal_group(w.child_pid or self._status(w).get("child_pid"), signum)

    # ending

    def _kill_leftovers(self, w: Workload) -> bool:
        """SIGKILL what the command left behind (daemons, setsid children). True when none is left."""
        if w.cgroup and Path(w.cgroup).is_dir() and not cgroups.kill_and_remove(Path(w.cgroup)):
            return False
        signal_group(w.child_pid, signal.SIGKILL)
        if group_alive(w.child_pid):
            return False
        if w.device_cgroup and Path(w.device_cgroup).is_dir():
            cgroups.kill_and_remove(Path(w.device_cgroup))
        return True

    def _start_next(self, w: Workload) -> None:
        if not self._kill_leftovers(w):
            return
        launch = parse_launch(w.next_launch or {})
        self._drop_files(w.lease, w.generation)
        del self.workloads[w.lease]
        self._launch(w.lease, w.next_gpus, launch)

    def _log_done(self, w: Workload) -> bool:
        if not any(self.logs_dir.glob(f"{w.lease}.*.log")) or self.log_drained(w.lease):
            return True
        return time.time() - (w.ended_seen or 0) > LOG_DRAIN_S

    def _remove_everything(self, w: Workload) -> bool:
        """Kill every process of the lease, remove its files and account; True when done.
        What fails is said once (not every tick) and tried again next tick."""
        name = account_name(w.lease)
        if not self._kill_leftovers(w):
            return self._trouble(w, "some of its processes survive SIGKILL (uninterruptible?)")
        shutil.rmtree(self.leases_dir / name, ignore_errors=True)
        for path in [*self.logs_dir.glob(f"{w.lease}.*"), *self.run_dir.glob(f"{w.lease}.*")]:
            path.unlink(missing_ok=True)
        try:
            if not release_account(name, self.leases_dir, _clear_uid):
                return self._trouble(w, "some of its processes survive SIGKILL (uninterruptible?)")
        except AgentError as error:
            return self._trouble(w, str(error))
        return True

    def _trouble(self, w: Workload, problem: str) -> bool:
        if w.cleanup_trouble != problem:
            w.cleanup_trouble = problem
            log.warning("lease %s: cannot finish removing it yet: %s; retrying", w.lease, problem)
        return False

    def _drop_files(self, lease: str, generation: int) -> None:
        """A replaced generation's spec and status (its log stays until shipped and cleaned)."""
        for what in ("spec.json", "status.json", "supervisor.err"):
            self._path(lease, generation, what).unlink(missing_ok=True)

    def snapshot(self) -> dict[str, dict]:
        with self.lock:
            return {lease: asdict(w) for lease, w in self.workloads.items()}

    def log_sources(self) -> list[tuple[str, int, Path, bool]]:
        """(lease, generation, log, ended) for every log on disk of a lease we hold."""
        with self.lock:
            sources = []
            for lease, w in self.workloads.items():
                for path in self.logs_dir.glob(f"{lease}.*.log"):
                    generation = int(path.name.split(".")[1])
                    running = generation == w.generation and w.state == "running"
                    sources.append((lease, generation, path, not running))
            return sources


def _workloads_from(records: dict[str, dict]) -> dict[str, Workload]:
    """The state file's records; one this version cannot read is said once and left out."""
    workloads = {}
    for lease, data in records.items():
        try:
            workloads[lease] = Workload.from_dict(data)
        except TypeError:
            log.warning("lease %s: its record in the state file is unreadable; not watched", lease)
    return workloads


def _clear_uid(uid: int) -> bool:
    """The last agent serving a lease on this host: every process and scratch file of its
    account goes (False when some process outlives SIGKILL)."""
    if not kill_uid(uid):
        return False
    remove_files_of(uid)
    return True


def _supervisor_env() -> dict[str, str]:
    """Only what the supervisor needs: not the agent's environment (it may hold the API key).
    IBEX's test suite may shift every process's clock (tests/clock.py): the offset goes along,
    so the supervisor's ended_at reads the same clock as the agent's started_at."""
    package_root = str(Path(agent.__file__).resolve().parent.parent)
    python_path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": python_path}
    if "IBEX_TEST_CLOCK_OFFSET_S" in os.environ:
        env["IBEX_TEST_CLOCK_OFFSET_S"] = os.environ["IBEX_TEST_CLOCK_OFFSET_S"]
    return env


def _write_private(path: Path, data: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(data, handle)
    os.replace(temporary, path)


def _now() -> str:
    return iso_utc(datetime.now(UTC)) or ""

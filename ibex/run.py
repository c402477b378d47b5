"""`make demo`: run a whole IBEX installation on this machine and stop it on Ctrl-C.

Starts (or reuses) the embedded PostgreSQL and Redis when DATABASE_URL / REDIS_URL are unset,
migrates, then runs the web server (gunicorn), a Celery worker and Celery beat as children;
after seeding, simulated node agents, simulated tenants and, where ibsim, OpenSM and
infiniband-diags are installed, one provider's fabric live (`manage.py fabric_sim`).
Ctrl-C (SIGINT) or SIGTERM stops the children in order, then the embedded services.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ibex.config import ConfigError, check_redis_url, database_from_url
from ibex.runtime import EmbeddedServiceError, use_embedded_services, var_dir

BASE_DIR = Path(__file__).resolve().parent.parent
STOP_GRACE_S = 20


class Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def preflight(env: dict[str, str]) -> None:
    """Fail with one line when PostgreSQL or Redis cannot be reached."""
    import psycopg
    import redis

    db = database_from_url(env["DATABASE_URL"])
    try:
        psycopg.connect(
            dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"], host=db["HOST"],
            port=db["PORT"] or None, connect_timeout=5,
        ).close()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cannot connect to PostgreSQL ({first}); check DATABASE_URL "
                          "or unset it to use the embedded PostgreSQL") from None
    url = check_redis_url(env["REDIS_URL"])
    try:
        redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3).ping()
    except (redis.RedisError, OSError) as exc:
        raise ConfigError(f"cannot reach Redis at {url} ({exc}); check REDIS_URL "
                          "or unset it to use the embedded Redis") from None


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def children(host: str, port: int) -> dict[str, list[str]]:
    python = sys.executable
    (var_dir() / "demo").mkdir(parents=True, exist_ok=True)  # the web's access log
    return {
        # the access log (every agent heartbeat) goes to a file, not over the terminal
        "web": [python, "-m", "gunicorn", "ibex.wsgi:application", "--bind", f"{host}:{port}",
                "--workers", os.environ.get("WEB_CONCURRENCY", "2"),
                # threads: agents hold heartbeats open until work arrives (HEARTBEAT_MAX_WAITERS
                # of them per process), the other threads keep serving pages and the API
                "--worker-class", "gthread", "--threads", "16",
                "--access-logfile", str(var_dir() / "demo" / "access.log")],
        # no -Q: the default queue and every placement partition (scheduler/routing.py)
        "worker": [python, "-m", "celery", "-A", "ibex", "worker", "--loglevel", "info",
                   "--concurrency", "2", "--hostname", f"demo-{os.getpid()}@%h"],
        "beat": [python, "-m", "celery", "-A", "ibex", "beat", "--loglevel", "info",
                 "--schedule", str(var_dir() / "celerybeat-schedule")],
        # sends what was recorded while Redis was down (beat itself needs Redis)
        "outbox": [python, "manage.py", "relay_outbox"],
    }


def wait_for_web(host: str, port: int, web: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and web.poll() is None:
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise ConfigError(f"the web server did not start listening on {host}:{port}")


def simulated_agents(host: str, port: int) -> dict[str, tuple[list[str], str]]:
    """One `ibex-agent simulate` per seeded provider, heartbeating its whole fabric: its
    command line and its provider key (passed as IBEX_API_KEY, never on the command line,
    where `ps` would show it)."""
    credentials = json.loads((var_dir() / "demo" / "credentials.json").read_text())
    agents = {}
    for slug, entry in sorted(credentials.items()):
        if entry["role"] != "provider" or not entry.get("fabric"):
            continue
        agents[f"agents:{slug}"] = ([
            sys.executable, "-m", "agent", "simulate", "--api", f"http://{host}:{port}",
            "--fabric", entry["fabric"], "--hosts", entry["hosts"],
            "--gpu-model", entry["gpu_model"], "--gpus", "8", "--quiet",
            "--control", str(var_dir() / "demo" / f"{slug}-control.json"),
        ], entry["key"])
    return agents


LIVE_FABRIC = "live-fabric"
LIVE_FABRIC_INTERVAL_S = 10


def live_fabric(host: str, port: int) -> tuple[list[str], str] | None:
    """`manage.py fabric_sim` for the seeded provider marked `live_fabric`: its command line
    and its provider key (passed as IBEX_API_KEY). With `--if-installed` it says in one line
    that the live fabric is off, and exits 0, where ibsim, OpenSM or infiniband-diags is
    missing. ibqueryerrors reads the counters: two runs a poll instead of two per node."""
    credentials = json.loads((var_dir() / "demo" / "credentials.json").read_text())
    entry = next((entry for _, entry in sorted(credentials.items())
                  if entry["role"] == "provider" and entry.get("live_fabric")), None)
    if entry is None:
        return None
    return ([sys.executable, "manage.py", "fabric_sim", entry["fabric"], "--if-installed",
             "--server", f"http://{host}:{port}", "--interval", str(LIVE_FABRIC_INTERVAL_S),
             "--counters", "ibqueryerrors", "--dir", str(var_dir() / "demo" / "fabric-sim")],
            entry["key"])


def stop_children(processes: dict[str, subprocess.Popen]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for name, process in processes.items():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"ibex: {name} did not stop in {STOP_GRACE_S} s; killing it", flush=True)
            process.kill()
            process.wait()


def main() -> int:
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    os.chdir(BASE_DIR)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
    os.environ.setdefault("DEBUG", "1")  # the demo serves plain HTTP on localhost
    host = os.environ.get("IBEX_HOST", "127.0.0.1")
    port = int(os.environ.get("IBEX_PORT", "8000"))
    processes: dict[str, subprocess.Popen] = {}
    try:
        if not port_is_free(host, port):
            raise ConfigError(f"port {port} on {host} is in use (another `make demo`?); "
                              "stop it or set IBEX_PORT")
        os.environ.update(use_embedded_services(
            database=not os.environ.get("DATABASE_URL"),
            broker=not os.environ.get("REDIS_URL"),
        ))
        preflight(dict(os.environ))
        subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], check=True)
        seed = os.environ.get("IBEX_DEMO_SEED", "1") != "0"
        if seed:
            subprocess.run([sys.executable, "manage.py", "seed_demo"], check=True)
        for name, argv in children(host, port).items():
            # Own sessions: Ctrl-C reaches only this runner, which stops them in order.
            processes[name] = subprocess.Popen(argv, start_new_session=True)
        if seed:
            wait_for_web(host, port, processes["web"])
            for name, (argv, key) in simulated_agents(host, port).items():
                processes[name] = subprocess.Popen(argv, start_new_session=True,
                                                   env={**os.environ, "IBEX_API_KEY": key})
            processes["tenants"] = subprocess.Popen(
                [sys.executable, "manage.py", "simulate_tenants", "--api",
                 f"http://{host}:{port}"], start_new_session=True)
            live = live_fabric(host, port)
            if live is not None:
                # stdin from /dev/null: its console is the FIFO var/demo/fabric-sim/console
                processes[LIVE_FABRIC] = subprocess.Popen(
                    live[0], start_new_session=True, stdin=subprocess.DEVNULL,
                    env={**os.environ, "IBEX_API_KEY": live[1]})
        print(f"\nIBEX is running at http://{host}:{port}/ (API: /api/v1/, docs: "
              f"/api/v1/docs/, readiness: /readyz; logins in var/demo/credentials.json). "
              f"Press Ctrl-C to stop.\n", flush=True)
        while True:
            for name, process in list(processes.items()):
                if process.poll() is None:
                    continue
                if name == LIVE_FABRIC:
                    # the live fabric is an extra: off (status 0, it said why) or failed, the
                    # exchange runs on without it
                    if process.returncode:
                        print(f"ibex: the live fabric exited with status {process.returncode} "
                              f"(logs in {var_dir() / 'demo' / 'fabric-sim'}); the rest of "
                              "the demo runs on", flush=True)
                    del processes[name]
                    continue
                print(f"ibex: {name} exited with status {process.returncode}; stopping",
                      flush=True)
                return 1
            time.sleep(0.5)
    except Stop as stop:
        print(f"\nibex: {stop} received, stopping", flush=True)
        return 0
    except (ConfigError, EmbeddedServiceError) as exc:
        print(f"ibex: {exc}", file=sys.stderr, flush=True)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"ibex: {' '.join(exc.cmd[1:])} failed with status {exc.returncode}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_children(processes)
        if processes:
            print("ibex: stopped cleanly", flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""`python -m agent.supervise SPEC`: run one lease's command and record how it ended.

The agent starts this small process in a session of its own, so the command's result is
written to the status file even when the agent is restarted (or killed) while it runs: the
agent never has to be the parent that waits. It forks the command, which joins the lease's
cgroup (as root, before the drop), starts its own session (its pid is the process group the
agent signals where there is no cgroup), becomes the lease account and execs the argv,
stdout and stderr appended to the lease's log. The supervisor itself stays outside the cgroup,
so killing the lease's processes never kills the one that records the result.

SPEC is JSON: {argv, env, uid, gid, workdir, log, status, cgroup, device_cgroup}. The status file gets
{"child_pid", "started_at"} at once, then {"exit_code", "ended_at", "error"} when it ends;
exit_code is 128 + N for a command killed by signal N, 127 when it could not start.
"""

import json
import os
import signal
import sys
import time
from datetime import UTC, datetime

CANNOT_START = 127


def main(argv: list[str]) -> int:
    # only SIGKILL stops the supervisor: a stray SIGTERM must not lose the command's result
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    with open(argv[0]) as handle:
        spec = json.load(handle)
    status: dict = {}
    try:
        log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(spec, log_fd, write_fd)  # never returns
        os.close(write_fd)
        os.close(log_fd)
        status = {"child_pid": pid, "started_at": _now()}
        _write_status(spec["status"], status)
        error = _read_all(read_fd)  # empty once exec succeeded (the pipe closed on exec)
        _, wait_status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(wait_status)
        status.update(exit_code=128 - code if code < 0 else code, ended_at=_now(), error=error)
    except Exception as problem:  # noqa: BLE001 - whatever it was, the agent must learn of it
        status.update(exit_code=CANNOT_START, ended_at=_now(), error=f"supervisor: {problem}")
    _write_status(spec["status"], status)
    return 0


def _child(spec: dict, log_fd: int, error_fd: int) -> None:
    """In the forked child: join the cgroup, drop to the account, exec. Reports failures on
    `error_fd` (closed by a successful exec) and exits 127."""
    step = "start"
    try:
        for key in ("cgroup", "device_cgroup"):
            if spec.get(key):
                step = "join its cgroup" if key == "cgroup" else "fence off the other GPUs"
                with open(os.path.join(spec[key], "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        step = "become its account"
        os.setgroups([])
        os.setgid(spec["gid"])
        os.setuid(spec["uid"])
        os.umask(0o077)  # what the command writes (in /tmp too) stays its own
        step = f"enter its workdir {spec['workdir']}"
        os.chdir(spec["workdir"])
        step = "run it"
        command = spec["argv"]
        os.execvpe(command[0], command, spec["env"])
    except FileNotFoundError:
        message = f"command not found: {spec['argv'][0]}" if step == "run it" else f"cannot {step}: not found"
        _fail(error_fd, message)
    except OSError as error:
        _fail(error_fd, f"cannot {step}: {(error.strerror or str(error)).lower()}")
    except BaseException as error:  # noqa: BLE001 - the child must never return into main()
        _fail(error_fd, f"cannot {step}: {error}")


def _fail(error_fd: int, message: str) -> None:
    try:
        os.write(error_fd, message.encode()[:4000])
    finally:
        os._exit(CANNOT_START)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _write_status(path: str, status: dict) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w") as handle:
        json.dump(status, handle)
    os.replace(temporary, path)


def _now() -> str:
    return datetime.fromtimestamp(time.time(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Per-lease Unix accounts: `ibex-l<lease id>`, a home under `<work-dir>/leases`, files in it.

Several agents on one host (tests, or one agent per GPU board) may serve the same lease: they
share its account, each with its own home under its own work dir. Each marks its use under
/run/ibex-agent/accounts/<name>/; the last to let go removes the account, its processes and
its scratch files.

The agent runs as root, so it never writes through a path a tenant controls: the home is made
by root in a root-owned directory, and what goes inside it (env.sh, authorized_keys, the
workdir) is written by a forked child that has become the account first, so a symlink the
tenant planted leads nowhere the tenant could not already write.
"""

import fcntl
import hashlib
import os
import pwd
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.errors import AgentError

ACCOUNT_PREFIX = "ibex-l"
# several agents on one host (tests, or one per GPU board) share /etc/passwd: one at a time
LOCK_PATH = Path("/run/ibex-agent/accounts.lock")
USERS_DIR = Path("/run/ibex-agent/accounts")
_LEASE_ID = re.compile(r"^[A-Za-z0-9_-]{1,26}$")  # user names are at most 32 characters
USERDEL_NO_SUCH_USER = 6


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: Path


def lease_id(lease: str) -> str:
    """The lease's id in the server's reference `L-<id>` (what IBEX_LEASE_ID says)."""
    return lease.removeprefix("L-")


def account_name(lease: str) -> str:
    if not _LEASE_ID.match(lease_id(lease)):
        raise AgentError(f"lease id {lease!r} cannot name a Unix account")
    return ACCOUNT_PREFIX + lease_id(lease)


def home_of(leases_dir: Path, lease: str) -> Path:
    return leases_dir / account_name(lease)


@contextmanager
def accounts_lock() -> Iterator[None]:
    LOCK_PATH.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(LOCK_PATH, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_account(lease: str, leases_dir: Path) -> Account:
    """The lease's account and its home (mode 700), created if missing (a restart may find it)."""
    name = account_name(lease)
    home = home_of(leases_dir, lease)
    with accounts_lock():
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            # `*`, not useradd's locked `!`: sshd refuses locked accounts even for keys (UsePAM no)
            _run(["useradd", "-M", "-U", "-d", str(home), "-s", "/bin/bash", "-p", "*", name])
            entry = pwd.getpwnam(name)
        mark = _user_mark(name, leases_dir)
        if entry.pw_dir != str(home) and not _other_live_users(mark):
            # left by an agent that died (or a run killed) before removing it: ours now. sshd
            # checks the modes of the directories above the keys up to the passwd home
            _run(["usermod", "-d", str(home), name])
        mark.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        mark.write_text(str(os.getpid()))
    account = Account(name, entry.pw_uid, entry.pw_gid, home)
    try:
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, account.uid, account.gid, follow_symlinks=False)
        os.chmod(home, 0o700, follow_symlinks=False)
    except OSError as error:
        raise AgentError(f"cannot make {home}: {error.strerror}") from None
    return account


def release_account(name: str, leases_dir: Path, clear_uid: Callable[[int], bool]) -> bool:
    """This agent no longer serves the lease. When no other agent on the host does, kill what
    is left of the account (`clear_uid`: False when some process survives), then userdel it
    (its group goes with it). True when this agent is done with it."""
    with accounts_lock():
        mark = _user_mark(name, leases_dir)
        if _other_live_users(mark):
            mark.unlink(missing_ok=True)
            return True  # another agent still runs the lease here: the account stays
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            uid = None
        if uid is not None and not clear_uid(uid):
            return False
        result = subprocess.run(["userdel", name], capture_output=True, text=True)
        if result.returncode not in (0, USERDEL_NO_SUCH_USER):
            raise AgentError(f"userdel {name} failed: {_first_line(result.stderr)}")
        mark.unlink(missing_ok=True)
        try:
            mark.parent.rmdir()
        except OSError:
            pass
        return True


def _user_mark(name: str, leases_dir: Path) -> Path:
    agent = hashlib.sha256(str(leases_dir.resolve()).encode()).hexdigest()[:16]
    return USERS_DIR / name / agent


def _other_live_users(mark: Path) -> list[Path]:
    """The marks of other agents still running (a mark holds its agent's pid); the marks of
    agents that died are dropped."""
    live = []
    try:
        others = [user for user in mark.parent.iterdir() if user != mark]
    except OSError:
        return []
    for user in others:
        try:
            os.kill(int(user.read_text() or "0"), 0)
            live.append(user)
        except (OSError, ValueError):
            user.unlink(missing_ok=True)
    return live


def account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def write_as(account: Account, path: Path, text: str, mode: int) -> None:
    """Write `path` (and its missing parent directories, mode 700) as the account itself."""
    pid = os.fork()
    if pid == 0:  # the child: only os calls, then _exit (the agent has other threads)
        code = 1
        try:
            _become(account)
            os.makedirs(path.parent, mode=0o700, exist_ok=True)
            temporary = f"{path}.tmp"
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            os.write(descriptor, text.encode())
            os.fchmod(descriptor, mode)
            os.close(descriptor)
            os.replace(temporary, path)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AgentError(f"cannot write {path} as {account.name}")


def make_dir_as(account: Account, path: Path) -> None:
    """mkdir -p as the account (the lease's workdir)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _become(account)
            os.makedirs(path, mode=0o700, exist_ok=True)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AgentError(f"cannot make {path} as {account.name}")


def _become(account: Account) -> None:
    os.setgroups([])
    os.setgid(account.gid)
    os.setuid(account.uid)
    os.umask(0o077)


def _run(argv: list[str]) -> None:
    try:
        result = subprocess.run(argv, capture_output=True, text=True)
    except OSError as error:
        raise AgentError(f"cannot run {argv[0]}: {error.strerror}") from None
    if result.returncode != 0:
        raise AgentError(f"{argv[0]} {argv[-1]} failed: {_first_line(result.stderr)}")


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["no reason given"])[0]

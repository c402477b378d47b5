"""What goes into a lease's home for its logins, and the removal of a lease's files.

`<home>/.ibex/env.sh` holds the launch environment, so an SSH login sees what the command
sees; the sshd's login script sources it and changes to the workdir it names.
"""

import os
import shlex
import shutil
import stat
from pathlib import Path

from agent.accounts import Account, write_as

SCRATCH_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))


def env_script(env: dict[str, str], workdir: Path) -> str:
    lines = ["# written by ibex-agent: the lease's launch environment, for SSH logins"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    lines.append(f"ibex_workdir={shlex.quote(str(workdir))}")
    return "\n".join(lines) + "\n"


def write_login_files(account: Account, env: dict[str, str], workdir: Path, ssh_keys: list[str] | None) -> None:
    """env.sh always; authorized_keys (mode 600 in a 700 .ssh) when the runtime is ssh."""
    write_as(account, account.home / ".ibex" / "env.sh", env_script(env, workdir), 0o600)
    if ssh_keys is not None:
        keys = "".join(key.strip() + "\n" for key in ssh_keys)
        write_as(account, account.home / ".ssh" / "authorized_keys", keys, 0o600)


def remove_files_of(uid: int, roots: tuple[Path, ...] = SCRATCH_DIRS) -> None:
    """Every file and directory `uid` owns under `roots` (symlinks removed, never followed).
    Run once the uid's processes are gone, so nothing races the walk."""
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in list(dirnames):
                path = os.path.join(dirpath, name)
                if _owned_by(path, uid):
                    dirnames.remove(name)
                    _remove(path)
            for name in filenames:
                path = os.path.join(dirpath, name)
                if _owned_by(path, uid):
                    _remove(path)


def _owned_by(path: str, uid: int) -> bool:
    try:
        return os.lstat(path).st_uid == uid
    except OSError:
        return False


def _remove(path: str) -> None:
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except OSError:
        pass

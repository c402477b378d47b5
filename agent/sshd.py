"""The `ssh` runtime's OpenSSH server: lease accounts only, keys only, the launch environment.

One `sshd -D` per agent, with its own config, host key and pid file under `<work-dir>/sshd`,
started when the agent starts and stopped when it stops. A login runs `login.sh` (ForceCommand),
which sources the lease's `.ibex/env.sh`, changes to its workdir and runs the requested command
(or an interactive shell), so a login sees exactly what the lease's command sees.
"""

import logging
import os
import shlex
import subprocess
from pathlib import Path

from agent.accounts import ACCOUNT_PREFIX
from agent.errors import AgentError

log = logging.getLogger("ibex-agent")

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = Path("/usr/lib/openssh/sftp-server")
STARTUP_S = 1.0  # sshd exits at once on a bad config or a taken port: watch it this long

LOGIN_SCRIPT = """#!/bin/bash
# ibex-agent: every lease login. The launch environment, the workdir, then what was asked.
umask 077
# this agent's home of the lease, not the passwd one: agents on one host share the account
HOME={leases_dir}/"$USER"
. "$HOME/.ibex/env.sh" || exit 1
cd "$ibex_workdir" 2>/dev/null || cd "$HOME" || exit 1
unset ibex_workdir
if [ -n "$SSH_ORIGINAL_COMMAND" ]; then
    exec /bin/bash -c "$SSH_ORIGINAL_COMMAND"
fi
exec /bin/bash -i
"""


def sshd_config(directory: Path, leases_dir: Path, address: str, port: int) -> str:
    lines = [
        f"ListenAddress {address}",
        f"Port {port}",
        f"HostKey {directory / 'ssh_host_ed25519_key'}",
        f"PidFile {directory / 'sshd.pid'}",
        f"AllowUsers {ACCOUNT_PREFIX}*",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin no",
        "UsePAM no",
        # the homes are 700 and the keys 600, owned by the account: strict checks pass
        f"AuthorizedKeysFile {leases_dir}/%u/.ssh/authorized_keys",
        "StrictModes yes",
        f"ForceCommand {directory / 'login.sh'}",
        "PermitUserEnvironment no",
        "X11Forwarding no",
        "PrintMotd no",
    ]
    if SFTP_SERVER.exists():
        lines.append(f"Subsystem sftp {SFTP_SERVER}")
    return "\n".join(lines) + "\n"


class SshServer:
    def __init__(self, work_dir: Path, leases_dir: Path, address: str, port: int) -> None:
        self.directory = work_dir / "sshd"
        self.leases_dir = leases_dir
        self.address = address
        self.port = port
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        if not os.access(SSHD, os.X_OK):
            raise AgentError(f"--runtime ssh needs OpenSSH's server at {SSHD} (install openssh-server)")
        self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        key = self.directory / "ssh_host_ed25519_key"
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "ibex-agent", "-f", str(key)])
        login = self.directory / "login.sh"
        login.write_text(LOGIN_SCRIPT.replace("{leases_dir}", shlex.quote(str(self.leases_dir))))
        os.chmod(login, 0o755)
        config = self.directory / "sshd_config"
        config.write_text(sshd_config(self.directory, self.leases_dir, self.address, self.port))
        os.chmod(config, 0o600)
        errors = self.directory / "sshd.log"
        with open(errors, "ab") as output:
            self.process = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                stdout=output, stderr=output, start_new_session=True,
            )
        try:
            self.process.wait(STARTUP_S)
        except subprocess.TimeoutExpired:
            log.info("sshd listens on %s port %d for lease accounts", self.address, self.port)
            return
        self.process = None
        raise AgentError(f"sshd did not start on {self.address} port {self.port}: {_last_line(errors)}")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise AgentError(f"{argv[0]} failed: {result.stderr.strip() or result.returncode}")


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no reason given"
    return lines[-1] if lines else "no reason given"

"""`manage.py fabric_sim FABRIC`: a fabric of the database as a live simulated fabric.

Writes the fabric (imported or generated, with its own GUIDs and names) as an ibsim net file,
starts ibsim, OpenSM (its routing engine chosen for the fabric's kind) and, once the subnet is
up, the fabric agent (`ibex-agent fabric`) reporting to the server, with OpenSM's configuration
directory and pid file so that leases' partitions are programmed. It prints one line per
process with where its log is, forwards ibsim console commands typed on its standard input or
written to DIR/console (`Unlink "leaf01"[5]`, `ReLink "leaf01"[5]`), and on SIGINT or SIGTERM
stops the agent, OpenSM and ibsim in that order (docs/fabric.md, "fabric_sim").
"""

from __future__ import annotations

import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from argparse import ArgumentTypeError
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from fabric.core.netfile import MAX_SIM_NODES, MAX_SIM_SWITCHES, ibsim_netfile
from fabric.live_sim import (
    PROMPT,
    ROUTING_ENGINES,
    SimulatedFabric,
    SimulatorError,
    install_hint,
    missing_programs,
    stop_process,
)
from fabric.models import Fabric, Hca, Switch
from fabric.selectors import load_spec
from ibex.runtime import var_dir

EDR_GBPS = 100  # ibsim's fastest 4x link
NAMES_LISTED = 20
CHECK_EVERY_S = 0.5


def example_unlink(spec) -> str:
    """`Unlink "leaf01"[5]` for the first switch-to-switch cable (else the first cable)."""
    names = {switch.guid: switch.name for switch in spec.switches}
    link = next((link for link in spec.links if link.a_guid in names and link.b_guid in names),
                spec.links[0])
    guid, port = (link.a_guid, link.a_port) if link.a_guid in names else (link.b_guid, link.b_port)
    return f'Unlink "{names[guid]}"[{port}]'


class Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


class Command(BaseCommand):
    help = ("Simulate a fabric of the database with ibsim and OpenSM and run the fabric agent "
            "against it; stop all three with Ctrl-C (docs/fabric.md).")

    def add_arguments(self, parser):
        parser.add_argument("fabric", help="the fabric's name in IBEX")
        parser.add_argument("--server", default="http://127.0.0.1:8000",
                            help="the IBEX server the agent reports to (default: %(default)s)")
        parser.add_argument("--token", default=None,
                            help="a key of the fabric's provider with the provide scope "
                                 "(default: $IBEX_API_KEY, which `ps` does not show)")
        parser.add_argument("--interval", type=_positive, default=10.0,
                            help="seconds between the agent's polls (default: %(default)s)")
        parser.add_argument("--counters", choices=("auto", "perfquery", "ibqueryerrors"),
                            default="auto", help="how the agent reads port counters "
                                                 "(docs/fabric.md; default: %(default)s)")
        parser.add_argument("--dir", type=Path, default=None,
                            help="where the net file, the logs, OpenSM's files and the console "
                                 "go (default: var/fabric-sim/FABRIC)")
        parser.add_argument("--if-installed", action="store_true",
                            help="when ibsim, OpenSM or infiniband-diags is missing, say so in "
                                 "one line and exit 0 (for `make demo`)")

    def handle(self, *args, fabric: str, server: str, token: str | None, interval: float,
               counters: str, dir: Path | None, if_installed: bool, **options):
        missing = missing_programs()
        if missing:
            if if_installed:
                self.stdout.write(f"fabric_sim: the live fabric is off: it {install_hint(missing)}")
                return
            raise CommandError(f"the live fabric {install_hint(missing)}")
        row = Fabric.objects.filter(name=fabric).first()
        if row is None:
            names = list(Fabric.objects.order_by("name").values_list("name", flat=True))
            listed = ", ".join(names[:NAMES_LISTED]) + (", ..." if len(names) > NAMES_LISTED else "")
            raise CommandError(f"no fabric named {fabric!r}; "
                               + (f"the fabrics are: {listed}" if names else
                                  "there is none yet: import or generate one first"))
        token = token or os.environ.get("IBEX_API_KEY")
        if not token:
            raise CommandError(f"the fabric agent needs a key of the fabric's provider "
                               f"({row.owner.slug}) with the provide scope: set IBEX_API_KEY "
                               "(or give --token)")
        switches = Switch.objects.filter(fabric=row).count()
        nodes = switches + Hca.objects.filter(fabric=row).count()
        if nodes > MAX_SIM_NODES or switches > MAX_SIM_SWITCHES:
            raise CommandError(f"{fabric} has {nodes} nodes ({switches} switches): ibsim holds "
                               f"at most {MAX_SIM_NODES} nodes and {MAX_SIM_SWITCHES} switches")
        spec = load_spec(row)
        directory = (dir or var_dir() / "fabric-sim" / fabric).resolve()
        engine = ROUTING_ENGINES.get(row.kind, "minhop")
        try:
            sim = SimulatedFabric(directory, ibsim_netfile(spec), routing_engine=engine,
                                  sweep_interval_s=5, bound_to_parent=True)
        except OSError as exc:
            raise CommandError(f"cannot write the simulator's files in {directory}: "
                               f"{exc.strerror or exc}") from None
        faster = sorted({link.rate_gbps for link in spec.links
                         if link.rate_gbps and link.rate_gbps > EDR_GBPS})
        if faster:
            self.stdout.write(f"fabric_sim: links of {', '.join(f'{r:g}' for r in faster)} Gb/s "
                              f"are simulated as EDR: the agent will report them at "
                              f"{EDR_GBPS} Gb/s")
        console = directory / "console"
        signal.signal(signal.SIGINT, _on_signal)
        signal.signal(signal.SIGTERM, _on_signal)
        agent: subprocess.Popen | None = None
        try:
            started = time.monotonic()
            sim.start_ibsim()
            self._say(f"ibsim (pid {sim.ibsim.pid}) simulates {fabric}: {len(spec.switches)} "
                      f"switches, {len(spec.hcas)} HCAs, {len(spec.links)} cables "
                      f"({sim.netfile}); log {sim.ibsim_log}")
            sim.start_opensm()
            self._say(f"OpenSM (pid {sim.opensm.pid}, routing {engine}): subnet up in "
                      f"{time.monotonic() - started:.1f} s; log {sim.opensm_log}")
            agent = self._start_agent(sim, fabric, server, token, interval, counters)
            self._say(f"fabric agent (pid {agent.pid}) reports to {server} every {interval:g} "
                      f"s; log {directory / 'agent.log'}")
            self._open_console(console)
            self._say(f"ibsim's console: type its commands here or write them to {console}, "
                      f"e.g. {example_unlink(spec)}; Ctrl-C stops all three")
            return self._serve(sim, agent, console, directory)
        except Stop as stop:
            self._say(f"{stop} received, stopping")
        except SimulatorError as exc:
            raise CommandError(str(exc)) from None
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stop_process(agent)
            sim.stop()
            self._say("stopped the fabric agent, OpenSM and ibsim")

    def _say(self, line: str) -> None:
        self.stdout.write(f"fabric_sim: {line}")
        self.stdout.flush()

    def _start_agent(self, sim: SimulatedFabric, fabric: str, server: str, token: str,
                     interval: float, counters: str) -> subprocess.Popen:
        # the key goes in the environment, never on the command line where `ps` shows it
        env = {**sim.env, "IBEX_API_KEY": token}
        with (sim.dir / "agent.log").open("w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "agent", "fabric", "--server", server, "--fabric", fabric,
                 "--interval", f"{interval:g}", "--counters", counters,
                 "--opensm-conf-dir", str(sim.osm_dir),
                 "--opensm-pid-file", str(sim.opensm_pid_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                # libumad2sim keeps a sys-PID folder in the working directory of every
                # program it runs in: the simulator's directory, not the checkout
                cwd=sim.dir, start_new_session=True, preexec_fn=sim.preexec)

    @staticmethod
    def _open_console(path: Path) -> None:
        if path.exists() and not stat.S_ISFIFO(path.stat().st_mode):
            path.unlink()
        if not path.exists():
            os.mkfifo(path, 0o600)

    def _serve(self, sim: SimulatedFabric, agent: subprocess.Popen, console: Path,
               directory: Path) -> None:
        """Forward console lines to ibsim until a signal, or until a process exits."""
        selector = selectors.DefaultSelector()
        # read and write: the FIFO never reaches end of file between two writers
        fifo = os.open(console, os.O_RDWR | os.O_NONBLOCK)
        selector.register(fifo, selectors.EVENT_READ, bytearray())
        stdin = sys.stdin.fileno() if sys.stdin is not None else None
        if stdin is not None:
            try:
                selector.register(stdin, selectors.EVENT_READ, bytearray())
            except (ValueError, OSError, PermissionError):  # a regular file or /dev/null
                self._forward_file(sim, stdin)
        try:
            while True:
                for key, _ in selector.select(CHECK_EVERY_S):
                    chunk = os.read(key.fd, 4096)
                    if not chunk:  # standard input closed: the FIFO still takes commands
                        selector.unregister(key.fd)
                        continue
                    key.data.extend(chunk)
                    while b"\n" in key.data:
                        line, _, rest = bytes(key.data).partition(b"\n")
                        key.data[:] = rest
                        self._forward(sim, line.decode(errors="replace").strip())
                for name, process in (("the fabric agent", agent), ("ibsim", sim.ibsim),
                                      ("OpenSM", sim.opensm)):
                    if process.poll() is not None:
                        log = (directory / "agent.log") if process is agent else None
                        tail = log.read_text(errors="replace").strip().splitlines()[-3:] \
                            if log and log.exists() else []
                        raise CommandError(f"{name} exited with status {process.returncode}"
                                           + (": " + " | ".join(tail) if tail else "")
                                           + f" (logs in {directory})")
        finally:
            selector.close()
            os.close(fifo)

    def _forward_file(self, sim: SimulatedFabric, fd: int) -> None:
        """Standard input that select cannot watch (a regular file): forward it whole."""
        for line in os.read(fd, 1 << 20).decode(errors="replace").splitlines():
            self._forward(sim, line.strip())

    def _forward(self, sim: SimulatedFabric, command: str) -> None:
        if not command or command.startswith("#"):
            return
        try:
            answer = sim.console(command)
        except SimulatorError as exc:
            self._say(f"ibsim did not take {command!r}: {str(exc).splitlines()[0]}")
            return
        answer = answer.replace(PROMPT, "").strip()
        self._say(f"ibsim: {command}" + (f": {answer}" if answer else ""))

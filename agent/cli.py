"""The `ibex-agent` command line: register, run, simulate, slurm, fabric.

Expected failures print one line, `ibex-agent: <what went wrong>`, and exit 1; bad arguments
exit 2; SIGINT/SIGTERM stop cleanly with exit 0.
"""

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from agent import __version__, sysinfo
from agent.client import ApiClient
from agent.errors import AgentError
from agent.fabric_agent import (
    COUNTER_TOOLS,
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_INTERVAL_S,
    PERFQUERY_MAX_NODES,
    FabricAgent,
    FabricAgentOptions,
)
from agent.fleet import Fleet, FleetOptions
from agent.heartbeat import GpuSample
from agent.ibports import ports_payload, read_ib_ports
from agent.logship import LogShipper
from agent.mig import MigControl
from agent.node import NodeAgent
from agent.nvml import NvmlUnavailable, open_nvml
from agent.parts import NodeEnforcer, SimulatedEnforcer
from agent.registration import register_or_rotate
from agent.slurm.gateway import GatewayOptions, SlurmGateway
from agent.slurm.scontrol import DEFAULT_GPU_MODELS
from agent.sshd import SshServer
from agent.state import NodeState, default_state_path, load_state, save_state
from agent.workloads import KINDS, Runtime
from fabric.core.hostlist import expand_hostlist

log = logging.getLogger("ibex-agent")


class UsageError(Exception):
    """Bad arguments found after parsing (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.quiet)
    try:
        return args.handler(args)
    except UsageError as error:
        args.parser.error(str(error))  # prints the command's usage and exits 2
    except AgentError as error:
        print(f"ibex-agent: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ibex-agent", description="The IBEX node agent.")
    parser.add_argument("--version", action="version", version=f"ibex-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    register = commands.add_parser("register", help="register this node and store its token")
    _add_server_arguments(register)
    register.add_argument("--hostname", default=None, help="default: this machine's hostname")
    register.add_argument("--gpu-model", default=None, help="default: from NVML (required without NVML)")
    register.add_argument("--gpus", type=_positive_int, default=None, help="default: from NVML")
    register.add_argument("--cpu-cores", type=_positive_int, default=None)
    register.add_argument("--memory-gib", type=_positive_int, default=None)
    _add_state_argument(register)
    _add_common_arguments(register)
    register.set_defaults(handler=command_register, parser=register)

    run = commands.add_parser("run", help="heartbeat this node")
    _add_state_argument(run)
    run.add_argument("--interval", type=_positive_float, default=None,
                     help="seconds between heartbeats until the server says otherwise")
    run.add_argument("--once", action="store_true", help="send one heartbeat and exit")
    run.add_argument("--runtime", choices=KINDS, default="none",
                     help="none: only report leases; process: run their commands as per-lease "
                          "accounts (root); ssh: also an sshd for them (default: none)")
    run.add_argument("--address", default=None,
                     help="how other nodes and tenants reach this node (default: its hostname)")
    run.add_argument("--ssh-port", type=_port, default=None, help="the sshd's port (with --runtime ssh)")
    run.add_argument("--simulate-gpus", type=_positive_int, default=None, metavar="N",
                     help="report N idle, healthy GPUs instead of reading NVML (a machine "
                          "without GPUs acting as a node: tests, rehearsals)")
    run.add_argument("--work-dir", type=Path, default=None,
                     help="lease homes, logs and sshd files (default: 'work' beside the state file)")
    _add_common_arguments(run)
    run.set_defaults(handler=command_run, parser=run)

    simulate = commands.add_parser("simulate", help="register and heartbeat simulated hosts")
    _add_server_arguments(simulate)
    simulate.add_argument("--hosts", required=True, help="host list, e.g. 'gpu[01-64]'")
    simulate.add_argument("--gpu-model", required=True)
    simulate.add_argument("--gpus", type=_positive_int, default=8, help="GPUs per host")
    simulate.add_argument("--cpu-cores", type=_positive_int, default=128)
    simulate.add_argument("--memory-gib", type=_positive_int, default=2048)
    simulate.add_argument("--interval", type=_positive_float, default=None,
                          help="seconds between heartbeats (default: the server's)")
    simulate.add_argument("--control", type=Path, default=None,
                          help="JSON failure-rehearsal file, re-read every cycle and on SIGUSR1")
    simulate.add_argument("--duration", type=_positive_float, default=None, help="stop after S seconds")
    simulate.add_argument("--workers", type=_positive_int, default=16, help="heartbeat threads")
    simulate.add_argument("--seed", type=int, default=0, help="seed for the simulated readings")
    simulate.add_argument("--runtime", choices=("none", "process"), default="process",
                          help="the runtime the hosts report; process: they pretend to run "
                               "workloads (default: process)")
    _add_common_arguments(simulate)
    simulate.set_defaults(handler=command_simulate, parser=simulate)

    slurm = commands.add_parser(
        "slurm", help="a gateway in front of a Slurm cluster: import it, watch it, and hold "
                      "IBEX leases as Slurm reservations (run once per cluster)")
    _add_server_arguments(slurm)
    slurm.add_argument("--partition", default=None,
                       help="offer only this partition's nodes (default: every node with GPUs)")
    slurm.add_argument("--interval", type=_positive_float, default=None,
                       help="seconds between reports (default: the server's)")
    slurm.add_argument("--gpu-type", action="append", default=[], metavar="TYPE=MODEL",
                       help="map a Slurm GRES type to an IBEX GPU model, e.g. h100nvl=H100-80GB "
                            "(repeatable; adds to the built-in mapping)")
    slurm.add_argument("--duration", type=_positive_float, default=None, help="stop after S seconds")
    _add_common_arguments(slurm)
    slurm.set_defaults(handler=command_slurm, parser=slurm)

    fabric = commands.add_parser(
        "fabric", help="the fabric agent beside the subnet manager: read the fabric with "
                       "infiniband-diags every interval and report it (docs/fabric.md)")
    fabric.add_argument("--server", required=True, help="the IBEX server, e.g. https://ibex.example.org")
    token_from_env = os.environ.get("IBEX_API_KEY")
    fabric.add_argument("--token", required=not token_from_env, default=token_from_env,
                        help="the provider's API key, scope 'provide' (default: $IBEX_API_KEY)")
    fabric.add_argument("--fabric", required=True, help="the fabric's name in IBEX")
    fabric.add_argument("--interval", type=_positive_float, default=DEFAULT_INTERVAL_S,
                        help=f"seconds between polls (default: {DEFAULT_INTERVAL_S:g})")
    fabric.add_argument("--opensm-conf-dir", type=Path, default=None,
                        help="the directory of the opensm.conf OpenSM runs with: the agent "
                             "writes the leases' partitions into its partitions.conf")
    fabric.add_argument("--opensm-pid-file", type=Path, default=None,
                        help="OpenSM's pid file: reported as whether the subnet manager runs, "
                             "and sent SIGHUP when partitions.conf changed")
    fabric.add_argument("--command-timeout", type=_positive_float, default=DEFAULT_COMMAND_TIMEOUT_S,
                        help="seconds a diagnostic may take before the fabric counts as "
                             f"unreachable (default: {DEFAULT_COMMAND_TIMEOUT_S:g})")
    fabric.add_argument("--counters", choices=COUNTER_TOOLS, default="auto",
                        help="how port counters are read: perfquery (two runs per node), "
                             "ibqueryerrors (two runs for the whole fabric), or auto: perfquery "
                             f"up to {PERFQUERY_MAX_NODES} nodes (default: auto)")
    fabric.add_argument("--once", action="store_true", help="poll and report once, then exit")
    _add_common_arguments(fabric)
    fabric.set_defaults(handler=command_fabric, parser=fabric)
    return parser


def _add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api", required=True, help="the IBEX server, e.g. https://ibex.example.org")
    # the key may come from the environment, so that it does not show in `ps`
    key_from_env = os.environ.get("IBEX_API_KEY")
    parser.add_argument("--key", required=not key_from_env, default=key_from_env,
                        help="the provider's API key (default: $IBEX_API_KEY)")
    parser.add_argument("--fabric", required=True, help="the fabric the node is cabled to")


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=_positive_float, default=10.0, help="HTTP timeout, seconds")
    parser.add_argument("--quiet", action="store_true", help="log warnings only")


def _add_state_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state", type=Path, default=None,
                        help="state file (default: $IBEX_AGENT_STATE or /var/lib/ibex-agent/node.json)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (1..65535): {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def setup_logging(quiet: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s ibex-agent: %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.WARNING if quiet else logging.INFO)


def stop_on_signals(stop: threading.Event) -> None:
    """SIGINT and SIGTERM ask for a clean stop (exit 0)."""
    def handle(signum, frame) -> None:
        log.info("%s received; stopping", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)


# register

def command_register(args: argparse.Namespace) -> int:
    spec = registration_spec(args)
    client = ApiClient(args.api, timeout_s=args.timeout)
    registered = register_or_rotate(client, args.key, spec)
    state_path = args.state or default_state_path()
    save_state(state_path, NodeState(
        api=client.api,
        node_id=registered.node_id,
        token=registered.token,
        hostname=registered.hostname,
        heartbeat_interval_s=registered.interval_s,
    ))
    log.info("%s registered as node %d; token stored in %s", registered.hostname, registered.node_id, state_path)
    print(registered.node_id)
    return 0


def registration_spec(args: argparse.Namespace) -> dict:
    """The registration body: this machine's facts, NVML's GPUs where present, flags on top."""
    spec: dict = {
        "hostname": args.hostname or sysinfo.hostname(),
        "fabric": args.fabric,
        "cpu_cores": args.cpu_cores or sysinfo.cpu_cores(),
        "memory_gib": args.memory_gib or sysinfo.memory_gib(),
    }
    if os_name := sysinfo.os_name():
        spec["os"] = os_name
    try:
        reader = open_nvml()
    except NvmlUnavailable as error:
        if not args.gpu_model or not args.gpus:
            raise UsageError(f"--gpu-model and --gpus are required without NVML: {error}") from None
        spec.update(gpu_model=args.gpu_model, gpu_count=args.gpus)
        return spec
    try:
        inventory = reader.inventory()
    finally:
        reader.close()
    spec.update(
        gpu_model=args.gpu_model or inventory.gpu_model,
        gpu_count=args.gpus or len(inventory.gpus),
        driver_version=inventory.driver_version,
    )
    if not args.gpus or args.gpus == len(inventory.gpus):
        spec["gpus"] = inventory.gpus
    return spec


# run

def command_run(args: argparse.Namespace) -> int:
    if args.runtime == "ssh" and args.ssh_port is None:
        raise UsageError("--runtime ssh needs --ssh-port")
    if args.ssh_port is not None and args.runtime != "ssh":
        raise UsageError("--ssh-port goes with --runtime ssh")
    state_path = args.state or default_state_path()
    state = load_state(state_path)
    runtime = Runtime(
        kind=args.runtime,
        address=args.address or sysinfo.hostname(),
        work_dir=(args.work_dir or state_path.parent / "work").absolute(),
        node_id=state.node_id,
        ssh_port=args.ssh_port,
        records=state.workloads,
        rails=read_ib_ports,
    )
    if args.work_dir is None and runtime.runs_commands:
        # the state dir is made 700; lease accounts must pass through it to reach their homes
        # under work/ (search only: the token file stays unlistable and mode 600)
        os.chmod(state_path.parent, state_path.parent.stat().st_mode | 0o011)
    runtime.prepare()
    shipper = None
    if runtime.runs_commands:
        # its own HTTP session: a requests.Session is not shared between threads
        shipper = LogShipper(ApiClient(state.api, timeout_s=args.timeout), state.node_id, state.token,
                             runtime.log_sources)
    if args.simulate_gpus:
        read_gpus, close = simulated_gpu_reader(args.simulate_gpus)
        enforcer = SimulatedEnforcer(state.hostname)
    else:
        read_gpus, close, enforcer = gpu_reader()
    stop = threading.Event()
    agent = NodeAgent(
        client=ApiClient(state.api, timeout_s=args.timeout),
        state=state,
        state_path=state_path,
        read_gpus=read_gpus,
        read_ib_ports=lambda: ports_payload(read_ib_ports()),
        interval_s=args.interval,
        stop=stop,
        runtime=runtime,
        shipper=shipper,
        enforcer=enforcer,
    )
    sshd = SshServer(runtime.work_dir, runtime.leases_dir, runtime.address, args.ssh_port) \
        if args.runtime == "ssh" else None
    try:
        if args.once:
            if runtime.runs_commands:
                runtime.tick()  # learn what ended while no agent ran
            agent.beat()
            log.info("%s: heartbeat sent; serving %s", state.hostname,
                     ", ".join(agent.leases.lease_ids()) or "nothing")
        else:
            stop_on_signals(stop)
            if sshd:
                sshd.start()
            log.info("%s: heartbeating node %d to %s every %g s (runtime %s)", state.hostname,
                     state.node_id, state.api, agent.interval_s, runtime.kind)
            agent.run_forever()
    finally:
        if sshd:
            sshd.stop()
        close()
    return 0


def simulated_gpu_reader(count: int):
    """Idle, healthy readings of `count` GPUs (`--simulate-gpus`)."""
    samples = [GpuSample(index=i, temperature_c=35, utilization_pct=0, memory_used_mib=0,
                         ecc_errors=0, xid_errors=0) for i in range(count)]
    return (lambda: samples), (lambda: None)


def gpu_reader():
    """NVML's reader and the parts' enforcer where a driver is present; else a warning, no GPU
    readings, and MIG slices reported as not made (with NVML's reason)."""
    try:
        reader = open_nvml()
    except NvmlUnavailable as error:
        log.warning("no GPU readings: %s", error)
        return (lambda: []), (lambda: None), NodeEnforcer(None, str(error))
    return reader.sample, reader.close, NodeEnforcer(MigControl(reader.nvml, reader.handles))


# simulate

def hostnames_of(text: str) -> list[str]:
    """The hosts `--hosts` names, each once, in order. A person types `gpu[01-04], login1`,
    so spaces around commas are dropped before the hostlist is expanded."""
    return list(dict.fromkeys(expand_hostlist(re.sub(r"\s*,\s*", ",", text))))


def command_simulate(args: argparse.Namespace) -> int:
    try:
        hostnames = hostnames_of(args.hosts)
    except ValueError as error:
        raise UsageError(f"--hosts: {error}") from None
    stop = threading.Event()
    fleet = Fleet(FleetOptions(
        api=args.api,
        key=args.key,
        fabric=args.fabric,
        hostnames=hostnames,
        gpu_model=args.gpu_model,
        gpus=args.gpus,
        interval_s=args.interval,
        cpu_cores=args.cpu_cores,
        memory_gib=args.memory_gib,
        workers=args.workers,
        seed=args.seed,
        control_path=args.control,
        duration_s=args.duration,
        timeout_s=args.timeout,
        runtime=args.runtime,
    ), stop)
    stop_on_signals(stop)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: fleet.reload_control.set())
    fleet.run()
    return 0


# slurm

def command_slurm(args: argparse.Namespace) -> int:
    mapping = dict(DEFAULT_GPU_MODELS)
    for item in args.gpu_type:
        gres_type, sep, model = item.partition("=")
        if not sep or not gres_type or not model:
            raise UsageError(f"--gpu-type: expected TYPE=MODEL, got {item!r}")
        mapping[gres_type.lower()] = model
    stop = threading.Event()
    gateway = SlurmGateway(GatewayOptions(
        api=args.api, key=args.key, fabric=args.fabric, partition=args.partition,
        interval_s=args.interval, timeout_s=args.timeout, gpu_models=mapping), stop=stop)
    stop_on_signals(stop)
    gateway.run(duration_s=args.duration)
    return 0


# fabric

def command_fabric(args: argparse.Namespace) -> int:
    stop = threading.Event()
    agent = FabricAgent(FabricAgentOptions(
        server=args.server, token=args.token, fabric=args.fabric, interval_s=args.interval,
        opensm_conf_dir=args.opensm_conf_dir, opensm_pid_file=args.opensm_pid_file,
        timeout_s=args.timeout, command_timeout_s=args.command_timeout,
        counters_tool=args.counters), stop=stop)
    if args.once:
        answer = agent.poll_once()
        links = answer.get("links", {})
        written = agent.partitions_written
        partitions = "" if written is None else (
            f"; partitions {written.partitions}"
            f"{' written' if written.changed else ' unchanged'}"
            f"{', OpenSM signalled' if written.signalled else ''}")
        print(f"{args.fabric}: {'reachable' if answer.get('reachable') else 'unreachable'}; "
              f"links {links.get('active', 0)} active, {links.get('down', 0)} down{partitions}")
        return 0
    stop_on_signals(stop)
    log.info("%s: reporting to %s every %g s", args.fabric, args.server, args.interval)
    agent.run_forever()
    return 0

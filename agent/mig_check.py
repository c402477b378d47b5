"""`python -m agent.mig_check [--gpu 0] [--profile 1g.10gb] [--start 0] [--enable-mig]`: one MIG
slice created and destroyed through the agent's own code path on a real GPU, printing what NVML
said at every step.

It starts a lease with one part, `{"index": GPU, "mig_profile": PROFILE, "start": START}`,
exactly as a heartbeat's `start` action would (agent.parts.PartsManager with the NVML
enforcer), prints the device the heartbeat would report (the MIG device's UUID), then stops the
lease and destroys the slice, and checks NVML no longer knows its GPU instance.

It leaves MIG mode as it found it: where MIG mode is off it says so and shows the agent's
answer (`MIG mode is not enabled on GPU 0`) unless `--enable-mig` is given; then it asks NVML
to turn MIG mode on (root; the GPU must be idle, and some GPUs need a reset before it takes
effect: NVML's answer is printed) and turns it off again at the end. Needs root for the slice
itself too. Exit status: 0 when the slice was created and destroyed, 1 otherwise.
"""

import argparse
import json
import logging
import sys

from agent.heartbeat import Action
from agent.mig import MigControl, MigError
from agent.parts import (
    NodeEnforcer,
    PartsManager,
    mps_daemon_trouble,
    mps_pipe_directory,
    parse_parts,
)

LEASE = "mig-check"


def main(argv: list[str] | None = None, nvml=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.mig_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="GPU index (default 0)")
    parser.add_argument("--profile", default=None,
                        help="IBEX profile name, e.g. 1g.10gb (default: the GPU's smallest 1g)")
    parser.add_argument("--start", type=int, default=0, help="memory slot to place it at (default 0)")
    parser.add_argument("--enable-mig", action="store_true",
                        help="turn MIG mode on if it is off (and off again at the end)")
    args = parser.parse_args(argv)
    agent_log = logging.getLogger("ibex-agent")  # what the agent itself logs, in line
    before = (list(agent_log.handlers), agent_log.propagate, agent_log.level)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("agent: %(message)s"))
    agent_log.handlers[:], agent_log.propagate = [handler], False
    agent_log.setLevel(logging.INFO)
    try:
        return _run(args, nvml)
    finally:
        agent_log.handlers[:], agent_log.propagate = before[0], before[1]
        agent_log.setLevel(before[2])


def _run(args, nvml) -> int:
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            say("the nvidia-ml-py package is not installed")
            return 1
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        say(f"nvmlInit: {error}")
        return 1
    say("nvmlInit: ok")
    try:
        return _check(nvml, args)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as error:
            say(f"nvmlShutdown: {error}")


def say(line: str) -> None:
    print(line, flush=True)


def _check(nvml, args) -> int:
    count = nvml.nvmlDeviceGetCount()
    say(f"driver {_text(nvml.nvmlSystemGetDriverVersion())}, {count} GPUs")
    if not 0 <= args.gpu < count:
        say(f"there is no GPU {args.gpu}")
        return 1
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    handle = handles[args.gpu]
    say(f"GPU {args.gpu}: {_text(nvml.nvmlDeviceGetName(handle))}")
    control = MigControl(nvml, handles, trace=lambda line: say(f"  NVML {line}"))
    trouble = mps_daemon_trouble(mps_pipe_directory())
    say(f"MPS: {trouble or f'control daemon listening in {mps_pipe_directory()}'}")

    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError as error:
        say(f"nvmlDeviceGetMigMode: {error} (this GPU cannot do MIG)")
        return 1
    say(f"MIG mode: current {_mode(nvml, current)}, pending {_mode(nvml, pending)}")
    turned_on = False
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        if not args.enable_mig:
            say("MIG mode is off; leaving it so (pass --enable-mig to have it turned on and off again)")
            _through_the_agent(nvml, control, args, args.profile or "1g.10gb")
            return 1
        turned_on = _enable(nvml, handle)
        if not turned_on:
            return 1
    try:
        profiles = control.profiles(args.gpu)
        for profile in profiles:
            say(f"profile {profile.name}: NVML id {profile.profile_id} ({profile.constant}), "
                f"{profile.compute} compute slices, {profile.slots} memory slots, {profile.memory_mib} MiB, "
                f"starts {list(profile.starts)}")
        smallest = [p for p in profiles if p.compute == 1 and p.slots == 1]
        name = args.profile or (smallest[0].name if smallest else "1g.10gb")
        return 0 if _through_the_agent(nvml, control, args, name) else 1
    finally:
        if turned_on:
            try:
                nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_DISABLE)
                say("nvmlDeviceSetMigMode(disable): ok (MIG mode back off)")
            except nvml.NVMLError as error:
                say(f"nvmlDeviceSetMigMode(disable): {error}")


def _enable(nvml, handle) -> bool:
    try:
        status = nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_ENABLE)
        say(f"nvmlDeviceSetMigMode(enable): ok (activation status {status})")
    except nvml.NVMLError as error:
        say(f"nvmlDeviceSetMigMode(enable): {error}")
        return False
    current, pending = nvml.nvmlDeviceGetMigMode(handle)
    say(f"MIG mode: current {_mode(nvml, current)}, pending {_mode(nvml, pending)}")
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        say("MIG mode is pending: the GPU needs a reset (nvidia-smi -r) before it takes effect")
        try:
            nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_DISABLE)
        except nvml.NVMLError as error:
            say(f"nvmlDeviceSetMigMode(disable): {error}")
        return False
    return True


def _through_the_agent(nvml, control: MigControl, args, profile: str) -> bool:
    """Start and stop a lease with one slice, as heartbeat actions would; True if the slice
    was made and is gone again."""
    part = {"index": args.gpu, "mig_profile": profile, "start": args.start}
    say(f"start lease {LEASE} with parts [{json.dumps(part)}]")
    parts = PartsManager(NodeEnforcer(control))
    parts.apply([Action("start", LEASE, [args.gpu], parts=parse_parts([part]))])
    device = parts.reports()[LEASE][0]
    say(f"device reported: {json.dumps(device)}")
    if not device["enforced"]:
        return False
    gi_id = parts.snapshot()[LEASE]["devices"][0]["gpu_instance_id"]
    say(f"CUDA_VISIBLE_DEVICES={device['uuid']} for the lease's processes")
    say(f"stop lease {LEASE}")
    parts.apply([Action("stop", LEASE, [args.gpu])])
    if not parts.release():
        say(f"the slice is not destroyed: {parts.leases[LEASE].trouble}")
        return False
    try:
        control._call("nvmlDeviceGetGpuInstanceById", control.handle(args.gpu), gi_id)
    except MigError as error:
        say(f"GPU instance {gi_id} is gone ({error})")
        return True
    say(f"GPU instance {gi_id} still exists after its destruction")
    return False


def _mode(nvml, value: int) -> str:
    return {nvml.NVML_DEVICE_MIG_ENABLE: "enabled", nvml.NVML_DEVICE_MIG_DISABLE: "disabled"}.get(value, str(value))


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


if __name__ == "__main__":
    sys.exit(main())

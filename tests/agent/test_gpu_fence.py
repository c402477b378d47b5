"""A lease's command cannot open the node's other GPUs: a v1 devices cgroup denies their
device files (/dev/nvidia<index>, major 195). Checked with device nodes made here: no NVIDIA
driver is needed to see the kernel refuse the open."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent import cgroups

DEVICES = cgroups.CGROUP_ROOT / "devices"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (DEVICES / "devices.deny").exists(),
    reason="fencing GPUs needs root and a writable cgroup v1 devices hierarchy")

OPEN_EACH = r"""
import errno, os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print("opened")
    except OSError as error:
        print(errno.errorcode[error.errno])
"""


def test_a_fenced_command_cannot_open_the_gpus_its_lease_does_not_hold(tmp_path):
    nodes = []
    for index in range(4):
        node = tmp_path / f"nvidia{index}"
        os.mknod(node, 0o666 | 0o020000, os.makedev(cgroups.NVIDIA_MAJOR, index))
        nodes.append(str(node))
    fence = cgroups.fence_gpus(f"test-fence-{os.getpid()}", leased=[1, 2], gpus_on_node=4)
    assert fence is not None
    try:
        result = subprocess.run(
            [sys.executable, "-c", "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid()));"
             f" os.execv(sys.executable, [sys.executable, '-c', {OPEN_EACH!r}, *sys.argv[2:]])",
             str(fence / "cgroup.procs"), *nodes],
            capture_output=True, text=True, timeout=30)
    finally:
        cgroups.kill_and_remove(fence)

    # EPERM: the fence refused; ENXIO: allowed, and no driver behind the node here
    assert result.stdout.split() == ["EPERM", "ENXIO", "ENXIO", "EPERM"], result.stderr
    assert not Path(fence).exists()


def test_without_a_devices_hierarchy_there_is_no_fence(tmp_path):
    assert cgroups.fence_gpus("x", leased=[0], gpus_on_node=2, root=tmp_path) is None

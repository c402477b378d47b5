"""The `simulated_fabric` fixture: a small fat tree (SPEC) simulated by ibsim under a real OpenSM,
every cable Active before the test starts.

The tests fail, saying what to install, where ibsim, OpenSM or infiniband-diags is missing
(`.ci/run` installs them): a skipped test would hide that the live fabric went untested.
"""

import pytest

from fabric.core.generators import fat_tree
from fabric.core.netfile import ibsim_netfile
from fabric.live_sim import PACKAGES, SimulatedFabric, missing_programs

# 4 leaves of 4 hosts under 4 spines: 16 hosts, 8 switches, 32 cables. EDR is the fastest
# speed ibsim simulates, so the spec says 100 Gb/s and the live rates agree with it.
SPEC = fat_tree(16, 8, rate_gbps=100)
# The scale the issue proves partitions at: 8 leaves of 8 hosts under 8 spines.
SPEC_64 = fat_tree(64, 16, rate_gbps=100)


@pytest.fixture
def fabric_spec():
    """The fabric the simulator runs and IBEX holds; a module may override it."""
    return SPEC


@pytest.fixture
def simulated_fabric(tmp_path, fabric_spec):
    missing = missing_programs()
    if missing:
        pytest.fail(f"the live fabric tests need {', '.join(missing)}: apt-get install {PACKAGES}")
    fabric = SimulatedFabric(tmp_path, ibsim_netfile(fabric_spec))
    try:
        fabric.start()
        fabric.wait_until_every_cable_is_active()
        yield fabric
    finally:
        fabric.stop()

"""The ``slurm_cluster`` fixture: a real four-node Slurm cluster for the tests of this folder.

One cluster per test module (starting one takes about a second); a test that changes a node
(drains it, runs a job) puts it back or uses its own module. Skipped, with the reason, where
Slurm or munge is not installed, or the tests do not run as root (mknod, SlurmUser=root).
"""

import os

import pytest

from tests.agent.slurm.cluster import missing_programs, start_cluster


def skip_without_slurm() -> None:
    missing = missing_programs()
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}); "
                    f"apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip("a local Slurm cluster needs root (mknod for the GPU device files, "
                    "SlurmUser=root)")


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    skip_without_slurm()
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster
    finally:
        cluster.stop()

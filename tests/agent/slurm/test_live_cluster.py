"""The parsers against a real Slurm cluster (tests/agent/slurm/cluster.py), not just captures.

Skipped where Slurm is not installed (see conftest.py). Tests that change a node put it back,
so the order of the tests does not matter.
"""

import subprocess
import time

from agent.slurm.scontrol import parse_nodes_json, parse_nodes_text, parse_topology
from tests.agent.slurm.cluster import (
    CPUS_PER_NODE,
    GPU_TYPE,
    GPUS_PER_NODE,
    MEMORY_MIB,
    NODES,
    start_cluster,
)

JOB_START_TIMEOUT_S = 20.0


def _sinfo_json(cluster) -> str:
    return subprocess.run(["sinfo", "--json"], env=cluster.env, capture_output=True, text=True,
                          check=True, timeout=10).stdout


def test_the_live_cluster_reads_as_four_idle_nodes_with_eight_gpus_each(slurm_cluster):
    for nodes in (parse_nodes_text(slurm_cluster.scontrol("show", "nodes")),
                  parse_nodes_text(slurm_cluster.scontrol("show", "nodes", "-o")),
                  parse_nodes_json(_sinfo_json(slurm_cluster))):
        assert [n.name for n in nodes] == NODES
        for node in nodes:
            assert node.states == {"IDLE"}
            assert node.available
            assert (node.cpus, node.memory_mib) == (CPUS_PER_NODE, MEMORY_MIB)
            assert node.gpus == {GPU_TYPE: GPUS_PER_NODE}


def test_a_node_drained_live_reads_as_drain_with_its_reason(slurm_cluster):
    slurm_cluster.scontrol("update", "NodeName=n002", "State=DRAIN", "Reason=fan failure")
    try:
        text_nodes = {n.name: n for n in parse_nodes_text(slurm_cluster.scontrol("show", "nodes"))}
        json_nodes = {n.name: n for n in parse_nodes_json(_sinfo_json(slurm_cluster))}
        for nodes in (text_nodes, json_nodes):
            assert "DRAIN" in nodes["n002"].states
            assert nodes["n002"].reason == "fan failure"
            assert not nodes["n002"].available
            assert nodes["n001"].available
    finally:
        slurm_cluster.scontrol("update", "NodeName=n002", "State=RESUME")


def test_the_live_topology_has_two_leaves_under_one_spine(slurm_cluster):
    topology = parse_topology(slurm_cluster.scontrol("show", "topology"))
    assert {s.name: s.nodes for s in topology.leaves} == {
        "leaf1": ("n001", "n002"), "leaf2": ("n003", "n004")}
    assert [s.name for s in topology.roots] == ["spine"]


def test_gpus_held_by_a_running_job_show_as_in_use(slurm_cluster):
    job = slurm_cluster.sbatch(f"--gres=gpu:{GPU_TYPE}:3", "-w", "n003", "-n1", "--mem=100",
                               "--wrap", "sleep 60")
    try:
        # The scheduler places the job on its next pass, a few seconds at most.
        deadline = time.monotonic() + JOB_START_TIMEOUT_S
        while True:
            (node,) = parse_nodes_text(slurm_cluster.scontrol("show", "nodes", "-d", "n003"))
            if node.gpus_used and node.gpus_used.get(GPU_TYPE):
                break
            assert time.monotonic() < deadline, f"job {job} never started:\n{slurm_cluster.logs()}"
            time.sleep(0.2)
        assert node.gpus_used == {GPU_TYPE: 3}
        assert "MIXED" in node.states
        (busy,) = [n for n in parse_nodes_json(_sinfo_json(slurm_cluster)) if n.name == "n003"]
        assert busy.gpus_used == {GPU_TYPE: 3}
    finally:
        subprocess.run(["scancel", job], env=slurm_cluster.env, capture_output=True, timeout=10)


def test_a_stopped_cluster_leaves_no_process_behind(tmp_path):
    from tests.agent.slurm.conftest import skip_without_slurm
    skip_without_slurm()
    cluster = start_cluster(tmp_path)
    pids = [p.pid for p in cluster.processes.values()]
    cluster.sbatch("-n1", "--mem=100", "--wrap", "sleep 60")
    cluster.stop()
    assert cluster.own_leftover_pids() == []
    for pid in pids:
        state = _proc_state(pid)
        assert state in (None, "Z"), f"daemon {pid} still running ({state})"


def _proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None

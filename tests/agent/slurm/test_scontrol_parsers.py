"""The parsers of agent.slurm.scontrol on output captured from a real Slurm 22.05.8 cluster.

The strings below were printed by the cluster of tests/agent/slurm/cluster.py (Debian's slurm-wlm
22.05.8): n002 drained with Reason="fan failure", n003 running a job holding 3 of its 8 GPUs.
The JSON is ``sinfo --json`` (22.05's scontrol has no --json), cut to two nodes and the fields
IBEX reads; the one marked 23.02 follows the documented shape of later versions instead.
"""

import subprocess
import sys

import pytest

from agent.slurm.scontrol import (
    DEFAULT_GPU_MODELS,
    SlurmParseError,
    UnknownGpuType,
    gpu_model_for,
    parse_gpu_gres,
    parse_nodes_json,
    parse_nodes_text,
    parse_topology,
)

DRAINED_NODE_TEXT = """\
NodeName=n002 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.74
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=gpu:h100:8
   NodeAddr=127.0.0.1 NodeHostName=localhost Port=46015 Version=22.05.8
   OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0
   RealMemory=2048 AllocMem=0 FreeMem=21270 Sockets=4 Boards=1
   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2026-12-03T05:53:46 SlurmdStartTime=2026-12-03T08:00:58
   LastBusyTime=2026-12-03T08:00:58
   CfgTRES=cpu=4,mem=2G,billing=4
   AllocTRES=
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s
   Reason=fan failure [root@2026-12-03T08:01:00]

"""

# ``scontrol show nodes -d n003`` while a job held three GPUs: -d adds GresUsed.
ALLOCATED_NODE_DETAILS = """\
NodeName=n003 Arch=x86_64 CoresPerSocket=1
   CPUAlloc=1 CPUEfctv=4 CPUTot=4 CPULoad=0.73
   AvailableFeatures=(null)
   ActiveFeatures=(null)
   Gres=gpu:h100:8
   GresDrain=N/A
   GresUsed=gpu:h100:3(IDX:0-2)
   NodeAddr=127.0.0.1 NodeHostName=localhost Port=42085 Version=22.05.8
   OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0
   RealMemory=2048 AllocMem=100 FreeMem=21740 Sockets=4 Boards=1
   State=MIXED ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A
   Partitions=gpu
   BootTime=2026-12-03T05:53:47 SlurmdStartTime=2026-12-03T08:02:07
   LastBusyTime=2026-12-03T08:02:07
   CfgTRES=cpu=4,mem=2G,billing=4
   AllocTRES=cpu=1,mem=100M
   CapWatts=n/a
   CurrentWatts=0 AveWatts=0
   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s

"""

# ``scontrol show nodes -o``: one line per node; Reason runs to the end of the line.
DRAINED_NODE_ONE_LINE = (
    'NodeName=n002 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 CPULoad=0.74 Av'
    'ailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:h100:8 NodeAddr=127.0.0.1 NodeHostNa'
    'me=localhost Port=46015 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @'
    '0  RealMemory=2048 AllocMem=0 FreeMem=21270 Sockets=4 Boards=1 State=IDLE+DRAIN ThreadsPer'
    'Core=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=gpu  BootTime=2026-12-03T05:5'
    '3:46 SlurmdStartTime=2026-12-03T08:00:58 LastBusyTime=2026-12-03T08:00:58 CfgTRES=cpu=4,me'
    'm=2G,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtS'
    'ensorsWatts=0 ExtSensorsTemp=n/s Reason=fan failure [root@2026-12-03T08:01:00]'
)

TOPOLOGY_TEXT = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n[001-002]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=n[003-004]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[001-004] Switches=leaf[1-2]
"""

SINFO_JSON_22_05 = """\
{
 "meta": {
  "plugin": {
   "type": "openapi/v0.0.38",
   "name": "Slurm OpenAPI v0.0.38"
  },
  "Slurm": {
   "version": {
    "major": 22,
    "micro": 8,
    "minor": 5
   },
   "release": "22.05.8"
  }
 },
 "errors": [],
 "nodes": [
  {
   "name": "n002",
   "state": "idle",
   "state_flags": [
    "DRAIN"
   ],
   "reason": "fan failure",
   "cpus": 4,
   "real_memory": 2048,
   "gres": "gpu:h100:8",
   "gres_used": "gpu:h100:0(IDX:N/A)",
   "gres_drained": "N/A",
   "alloc_cpus": 0,
   "partitions": [
    "gpu"
   ]
  },
  {
   "name": "n003",
   "state": "mixed",
   "state_flags": [],
   "reason": "",
   "cpus": 4,
   "real_memory": 2048,
   "gres": "gpu:h100:8",
   "gres_used": "gpu:h100:3(IDX:0-2)",
   "gres_drained": "N/A",
   "alloc_cpus": 1,
   "partitions": [
    "gpu"
   ]
  }
 ]
}
"""

# The shape of ``scontrol show nodes --json`` from 23.02 on (not captured: 22.05 lacks it):
# state is a list, and from data_parser v0.0.40 numbers are {"set", "infinite", "number"}.
SCONTROL_JSON_LATER = """\
{"nodes": [
 {"name": "gpu17", "state": ["IDLE", "DRAIN"], "reason": "xid 79",
  "cpus": 112, "real_memory": {"set": true, "infinite": false, "number": 2063000},
  "gres": "gpu:h100:8(S:0-1)", "gres_used": "gpu:h100:0(IDX:N/A)"},
 {"name": "gpu18", "state": ["MIXED"], "reason": "",
  "cpus": 112, "real_memory": 2063000, "gres": "gpu:h100:8(S:0-1)",
  "gres_used": "gpu:h100:2(IDX:0,5)"}
]}
"""


def test_a_drained_node_in_text_reads_as_idle_and_drain_with_its_reason():
    (node,) = parse_nodes_text(DRAINED_NODE_TEXT)
    assert node.name == "n002"
    assert node.states == {"IDLE", "DRAIN"}
    assert node.reason == "fan failure"
    assert not node.available
    assert (node.cpus, node.memory_mib) == (4, 2048)
    assert node.gpus == {"h100": 8}
    # Without -d Slurm does not say what is in use, and the parser does not guess.
    assert node.gpus_used is None


def test_scontrol_details_give_the_gpus_in_use_of_a_node_running_a_job():
    (node,) = parse_nodes_text(ALLOCATED_NODE_DETAILS)
    assert node.name == "n003"
    assert node.states == {"MIXED"}
    assert node.available
    assert node.reason == ""
    assert node.gpus == {"h100": 8}
    assert node.gpus_used == {"h100": 3}


def test_the_one_line_form_reads_the_same_as_the_block_form():
    assert parse_nodes_text(DRAINED_NODE_ONE_LINE) == parse_nodes_text(DRAINED_NODE_TEXT)


def test_several_blocks_give_one_node_each_in_order():
    nodes = parse_nodes_text(DRAINED_NODE_TEXT + "\n" + ALLOCATED_NODE_DETAILS)
    assert [n.name for n in nodes] == ["n002", "n003"]


def test_an_empty_cluster_has_no_nodes():
    assert parse_nodes_text("No nodes in the system\n") == []


def test_a_block_without_a_state_is_rejected():
    with pytest.raises(SlurmParseError):
        parse_nodes_text("NodeName=n001 CPUTot=4\n")


def test_sinfo_json_of_22_05_reads_like_the_text_form():
    drained, busy = parse_nodes_json(SINFO_JSON_22_05)
    assert drained.name == "n002"
    assert drained.states == {"IDLE", "DRAIN"}
    assert drained.reason == "fan failure"
    assert (drained.cpus, drained.memory_mib, drained.gpus) == (4, 2048, {"h100": 8})
    assert drained.gpus_used == {"h100": 0}
    assert busy.states == {"MIXED"}
    assert busy.gpus_used == {"h100": 3}


def test_later_json_with_state_lists_and_number_objects_is_read():
    drained, busy = parse_nodes_json(SCONTROL_JSON_LATER)
    assert drained.states == {"IDLE", "DRAIN"}
    assert drained.reason == "xid 79"
    assert drained.memory_mib == 2063000
    assert busy.gpus_used == {"h100": 2}


def test_json_without_a_node_list_is_rejected():
    with pytest.raises(SlurmParseError):
        parse_nodes_json('{"meta": {}}')
    with pytest.raises(SlurmParseError):
        parse_nodes_json("NodeName=n001")


def test_not_responding_and_maintenance_marks_become_states():
    (node,) = parse_nodes_text("NodeName=n009 State=DOWN*+DRAIN CPUTot=8\n   Reason=Not responding\n")
    assert node.states == {"DOWN", "DRAIN", "NOT_RESPONDING"}
    assert node.reason == "Not responding"
    (node,) = parse_nodes_text("NodeName=n010 State=IDLE$ CPUTot=8\n")
    assert node.states == {"IDLE", "MAINTENANCE"}


@pytest.mark.parametrize(("gres", "gpus"), [
    ("gpu:h100:8(S:0-1)", {"h100": 8}),
    ("gpu:8", {"": 8}),
    ("gpu:h100", {"h100": 1}),
    ("gpu:a100:2,gpu:h100:4(S:1)", {"a100": 2, "h100": 4}),
    ("gpu:h100:2(IDX:0,5),shard:h100:16", {"h100": 2}),
    ("gpu:H100:8", {"h100": 8}),
    ("(null)", {}),
    ("N/A", {}),
    ("", {}),
])
def test_gpu_gres_strings_give_counts_by_type(gres, gpus):
    assert parse_gpu_gres(gres) == gpus


def test_a_gres_string_that_is_not_gres_is_rejected():
    with pytest.raises(SlurmParseError):
        parse_gpu_gres("gpu:h100:8:extra")


def test_topology_has_two_leaves_under_one_spine_with_their_nodes():
    topology = parse_topology(TOPOLOGY_TEXT)
    assert sorted(s.name for s in topology.leaves) == ["leaf1", "leaf2"]
    assert [s.name for s in topology.roots] == ["spine"]
    assert topology.switches["leaf1"].nodes == ("n001", "n002")
    assert topology.switches["leaf2"].nodes == ("n003", "n004")
    spine = topology.switches["spine"]
    assert (spine.level, spine.switches) == (1, ("leaf1", "leaf2"))
    assert spine.nodes == ("n001", "n002", "n003", "n004")
    assert topology.leaf_of("n003").name == "leaf2"
    assert topology.parent_of("leaf1") is spine


def test_a_topology_line_without_a_switch_name_is_rejected():
    with pytest.raises(SlurmParseError):
        parse_topology("Level=0 Nodes=n001\n")


def test_slurm_gpu_types_map_to_ibex_gpu_models():
    assert gpu_model_for("h100") == "H100-80GB"
    assert gpu_model_for("a100") == "A100-80GB"
    assert gpu_model_for("H200") == "H200-141GB"
    assert gpu_model_for("rtx", {"rtx": "L40S-48GB"}) == "L40S-48GB"


def test_an_unknown_gpu_type_is_reported_not_guessed():
    with pytest.raises(UnknownGpuType, match="mi300x"):
        gpu_model_for("mi300x")
    # ``gpu:8`` says nothing about the model.
    with pytest.raises(UnknownGpuType, match="no type"):
        gpu_model_for("")


def test_every_default_gpu_model_is_in_the_catalogue():
    from pool.core.catalogue import GPU_MODELS
    names = {m["name"] for m in GPU_MODELS}
    assert set(DEFAULT_GPU_MODELS.values()) <= names


def test_the_slurm_parsers_load_without_django_or_the_server_apps():
    # The gateway runs on a cluster's login node, from the agent package alone.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, agent.slurm.scontrol; "
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'pool', 'ibex'}))"],
        capture_output=True, text=True, check=True,
    )
    assert loaded.stdout.strip() == "[]"

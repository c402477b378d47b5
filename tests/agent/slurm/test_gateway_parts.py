"""The gateway's pure parts on output captured from a real Slurm 22.05.8 cluster (the one of
tests/agent/slurm/cluster.py): reservations, jobs with their GPUs, the topology written back
as a topology.conf IBEX imports, and what the gateway reports busy or down."""

from datetime import UTC, datetime

from agent.slurm.gateway import Wanted, _busy, _down_reason, _outside_jobs, _serving
from agent.slurm.scontrol import (
    SlurmNode,
    parse_jobs_text,
    parse_reservations_text,
    parse_topology,
    topology_conf,
)
from fabric.core.slurm import parse_slurm_topology

RESERVATIONS = """\
ReservationName=ibex-lease-3 StartTime=2026-12-03T10:33:54 EndTime=2026-12-03T11:33:54 Duration=01:00:00 Nodes=n[001-002] NodeCnt=2 CoreCnt=8 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=8 Users=(null) Groups=(null) Accounts=physics Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)
ReservationName=maint StartTime=2026-12-03T12:00:00 EndTime=2026-12-03T13:00:00 Duration=01:00:00 Nodes=n003 NodeCnt=1 CoreCnt=4 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=4 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)
"""

# `scontrol -d -o show job`, cut to the fields the gateway reads and a few around them
JOBS = """\
JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) Account=physics QOS=(null) JobState=RUNNING Reason=None NodeList=n001 BatchHost=n001 NumNodes=1 JOB_GRES=gpu:h100:3   Nodes=n001 CPU_IDs=0 Mem=2048 GRES=gpu:h100:3(IDX:0-2) MinCPUsNode=1 Reservation=ibex-lease-3 OverSubscribe=OK
JobId=2 JobName=wrap UserId=alice(1000) GroupId=alice(1000) Account=(null) QOS=(null) JobState=RUNNING Reason=None NodeList=n[003-004] BatchHost=n003 NumNodes=2 JOB_GRES=gpu:h100:4   Nodes=n[003-004] CPU_IDs=0 Mem=2048 GRES=gpu:h100:2(IDX:1,6) MinCPUsNode=1 Reservation=(null) OverSubscribe=OK
JobId=3 JobName=wrap UserId=bob(1001) GroupId=bob(1001) Account=(null) QOS=(null) JobState=PENDING Reason=Resources NodeList= NumNodes=1 JOB_GRES=gpu:h100:8 MinCPUsNode=1 Reservation=(null) OverSubscribe=OK
"""

TOPOLOGY = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=n[001-002]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=n[003-004]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=n[001-004] Switches=leaf[1-2]
"""


def node(name: str, states=("IDLE",), reason="") -> SlurmNode:
    return SlurmNode(name=name, states=frozenset(states), reason=reason, gpus={"h100": 8})


def test_reservations_are_read_with_their_nodes_accounts_and_state():
    lease, maint = parse_reservations_text(RESERVATIONS)
    assert (lease.name, lease.nodes, lease.accounts, lease.state) == (
        "ibex-lease-3", frozenset({"n001", "n002"}), "physics", "ACTIVE")
    assert lease.end == "2026-12-03T11:33:54"
    assert (maint.accounts, maint.users, maint.state) == ("", "root", "INACTIVE")
    assert parse_reservations_text("No reservations in the system\n") == []


def test_jobs_are_read_with_the_gpu_indexes_they_hold_on_each_node():
    inside, outside, pending = parse_jobs_text(JOBS)
    assert (inside.reservation, inside.gpus) == ("ibex-lease-3", {"n001": (0, 1, 2)})
    assert (outside.user, outside.reservation) == ("alice", "")
    assert outside.gpus == {"n003": (1, 6), "n004": (1, 6)}
    assert pending.state == "PENDING" and pending.gpus == {}


def test_only_running_jobs_outside_ibex_reservations_make_gpus_busy():
    busy = _outside_jobs(parse_jobs_text(JOBS))
    assert busy == {"n003": {1: "job 2 of alice", 6: "job 2 of alice"},
                    "n004": {1: "job 2 of alice", 6: "job 2 of alice"}}


def test_a_node_an_ibex_reservation_holds_whole_offers_none_of_its_other_gpus():
    reservations = parse_reservations_text(RESERVATIONS)
    want = Wanted(name="ibex-lease-3", lease="L-3", account="physics",
                  ends_at=datetime(2026, 12, 3, 11, 33, 54, tzinfo=UTC),
                  nodes={"n001": [0, 1, 2, 3], "n002": list(range(8))})
    busy = _busy(node("n001"), {}, reservations, {want.name: want})
    assert [b["index"] for b in busy] == [4, 5, 6, 7]
    assert busy[0]["reason"] == "on a node reservation ibex-lease-3 holds whole"
    assert _busy(node("n002"), {}, reservations, {want.name: want}) == []
    # a maintenance window that has not started leaves the node for sale now
    assert _busy(node("n003"), {}, reservations, {}) == []


def test_leases_are_served_where_slurm_holds_their_reservation():
    assert _serving(parse_reservations_text(RESERVATIONS)) == {"n001": {"L-3"}, "n002": {"L-3"}}


def test_a_drained_or_unresponsive_node_is_down_with_slurms_reason():
    assert _down_reason(node("n001")) == ""
    assert _down_reason(node("n002", ("IDLE", "DRAIN"), "fan failure")) == "DRAIN+IDLE: fan failure"
    assert _down_reason(node("n003", ("IDLE", "NOT_RESPONDING"))) == "IDLE+NOT_RESPONDING"


def test_the_topology_is_written_back_as_a_topology_conf_ibex_imports():
    text = topology_conf(parse_topology(TOPOLOGY))
    assert text.splitlines() == ["SwitchName=leaf1 Nodes=n001,n002",
                                 "SwitchName=leaf2 Nodes=n003,n004",
                                 "SwitchName=spine Switches=leaf1,leaf2"]
    spec = parse_slurm_topology(text, path="campus", gpus_per_node=8)
    assert sorted(spec.hosts) == ["n001", "n002", "n003", "n004"]


def test_a_wanted_reservation_matches_slurms_only_with_the_same_nodes_end_and_account():
    (held, _) = parse_reservations_text(RESERVATIONS)
    end = datetime.strptime(held.end, "%Y-%m-%dT%H:%M:%S").astimezone()
    want = Wanted(name=held.name, lease="L-3", account="physics", ends_at=end,
                  nodes={"n001": [0], "n002": [0]})
    assert want.matches(held)
    assert not Wanted(**{**want.__dict__, "account": "chem"}).matches(held)
    assert not Wanted(**{**want.__dict__, "nodes": {"n001": [0]}}).matches(held)
    assert want.terms() == ["Nodes=n001,n002", "EndTime=2026-12-03T11:33:54", "Accounts=physics"]

"""What nodes run for leases, as the server side of docs/workloads.md: launches in start
actions, ranks, the port rank 0 picks, moves, notices, stops and the logs agents ship."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from pool import services, workloads
from pool.models import Binding, Node, WorkloadLog
from tests.pool.conftest import heartbeat, node_body

WORK = {"command": ["python3", "train.py"], "env": {"EPOCHS": "3"}, "workdir": "runs",
        "ssh_keys": []}


@pytest.fixture
def nodes(provider_client, fabric):
    """Three active nodes, node01..node03, whose agents run commands: {hostname: (id, token)}."""
    found = {}
    for name in ("node01", "node02", "node03"):
        body = provider_client.post("/api/v1/nodes/", node_body(name), format="json").json()
        found[name] = (body["id"], body["token"])
        beat(found[name], runtime={"kind": "process", "address": f"10.0.0.{name[-1]}"})
    return found


def beat(node, serving=(), **extra):
    node_id, token = node
    response = heartbeat(node_id, token, serving=serving, **extra)
    assert response.status_code == 200, response.content
    return response.json()


def report(lease="L-1", generation=1, state="running", **extra):
    return {"lease": lease, "generation": generation, "state": state, **extra}


def bind(lease, where: dict, work=WORK):
    return services.set_lease_bindings(wanted={lease: where}, launches={lease: work})


def test_a_heartbeat_records_what_the_nodes_agent_offers(nodes):
    node_id, token = nodes["node01"]

    beat(nodes["node01"], runtime={"kind": "ssh", "address": "gpu-a.example", "ssh_port": 2222})

    node = Node.objects.get(pk=node_id)
    assert (node.runtime, node.address, node.ssh_port) == ("ssh", "gpu-a.example", 2222)


@pytest.mark.parametrize("runtime, field", [
    ({"kind": "docker"}, "runtime.kind"),
    ({"kind": "ssh", "address": "a"}, "runtime.ssh_port"),
    ({"kind": "process", "ssh_port": 22}, "runtime.ssh_port"),
    ({"kind": "ssh", "ssh_port": 70000}, "runtime.ssh_port"),
])
def test_a_malformed_runtime_is_a_400_naming_the_field(nodes, runtime, field):
    node_id, token = nodes["node01"]

    response = heartbeat(node_id, token, runtime=runtime)

    assert response.status_code == 400
    assert field in str(response.json()["error"])
    assert Node.objects.get(pk=node_id).runtime == "process"


def test_rank_zero_starts_first_and_picks_the_port_the_other_ranks_are_told(nodes):
    a, b = nodes["node01"], nodes["node02"]
    bind("L-1", {b[0]: [0, 1], a[0]: [2, 3]})

    first = beat(a)["actions"]
    waiting = beat(b)

    assert first == [{"action": "start", "lease": "L-1", "gpus": [2, 3], "launch": {
        "lease_id": "1", "user": "ibex-l1", "generation": 1, "command": ["python3", "train.py"], "env": {"EPOCHS": "3"},
        "workdir": "runs", "ssh_keys": [], "node_rank": 0, "nnodes": 2,
        "node_addrs": ["10.0.0.1", "10.0.0.2"], "master_addr": "10.0.0.1",
        "master_port": None, "ib_pkey": "0x1000"}}]  # on two nodes: its own partition
    assert waiting["actions"] == []  # rank 1 waits for rank 0's port ...
    assert waiting["interval_s"] == 1  # ... and comes back soon

    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    second = beat(b)["actions"]

    assert [(x["action"], x["launch"]["node_rank"], x["launch"]["master_port"],
             x["launch"]["master_addr"]) for x in second] == [("start", 1, 29500, "10.0.0.1")]


def test_the_ranks_states_make_the_leases_workload_state(nodes):
    a, b = nodes["node01"], nodes["node02"]
    bind("L-1", {a[0]: [0], b[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    beat(b, serving=["L-1"], workloads=[report()])
    bindings = workloads.bindings_by_lease(["L-1"])["L-1"]
    assert workloads.workload_view(bindings, WORK)["state"] == "running"

    beat(a, serving=["L-1"], workloads=[report(state="exited", exit_code=0,
                                               ended_at=timezone.now().isoformat())])
    beat(b, serving=["L-1"], workloads=[report(state="failed", exit_code=3)])

    view = workloads.workload_view(workloads.bindings_by_lease(["L-1"])["L-1"], WORK)
    assert view["state"] == "failed"
    assert [(n["node"], n["node_rank"], n["state"], n["exit_code"]) for n in view["nodes"]] == [
        ("node01", 0, "exited", 0), ("node02", 1, "failed", 3)]


def test_a_report_of_an_older_generation_is_ignored(nodes):
    a, b, c = nodes["node01"], nodes["node02"], nodes["node03"]
    bind("L-1", {a[0]: [0], b[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])

    services.set_lease_bindings(wanted={"L-1": {a[0]: [0], c[0]: [0]}})  # a move, no launch named
    beat(a, serving=["L-1"], workloads=[report(state="stopped", generation=1)])

    binding = Binding.objects.get(node_id=a[0], lease_ref="L-1")
    assert (binding.generation, binding.workload_state, binding.master_port) == (2, "", None)


def test_a_move_restarts_every_rank_with_the_new_nodes_addresses(nodes):
    a, b, c = nodes["node01"], nodes["node02"], nodes["node03"]
    bind("L-1", {a[0]: [0], b[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    beat(b, serving=["L-1"], workloads=[report()])

    restarted = services.set_lease_bindings(wanted={"L-1": {a[0]: [0], c[0]: [5]}})

    assert restarted == ["L-1"]
    assert beat(b, serving=["L-1"], workloads=[report()])["actions"] == [
        {"action": "stop", "lease": "L-1", "gpus": [0], "grace_s": 30}]
    kept = beat(a, serving=["L-1"], workloads=[report()])["actions"]
    assert [(x["action"], x["launch"]["generation"], x["launch"]["node_addrs"],
             x["launch"]["master_port"]) for x in kept] == [
        ("start", 2, ["10.0.0.1", "10.0.0.3"], None)]
    beat(a, serving=["L-1"], workloads=[report(generation=2, master_port=29600)])
    new = beat(c)["actions"]
    assert [(x["launch"]["node_rank"], x["launch"]["master_port"], x["gpus"]) for x in new] == [
        (1, 29600, [5])]


def test_moving_a_lease_that_runs_nothing_restarts_nothing(nodes):
    a, b = nodes["node01"], nodes["node02"]
    services.set_lease_bindings(wanted={"L-2": {a[0]: [0]}}, launches={"L-2": None})

    assert services.set_lease_bindings(wanted={"L-2": {b[0]: [0]}}) == []
    assert beat(b)["actions"] == [{"action": "start", "lease": "L-2", "gpus": [0]}]


def test_a_notice_asks_for_sigterm_now_and_the_stop_after_it_leaves_no_grace(nodes):
    a = nodes["node01"]
    bind("L-1", {a[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    until = timezone.now() + timedelta(seconds=120)

    workloads.give_notice(lease_ref="L-1", until=until)
    noticed = beat(a, serving=["L-1"], workloads=[report()])["actions"]
    services.unbind_lease(node=Node.objects.get(pk=a[0]), lease_ref="L-1")
    Binding.objects.filter(lease_ref="L-1").update(notice_until=timezone.now())
    stopped = beat(a, serving=["L-1"], workloads=[report(state="stopped", exit_code=143)])

    assert noticed == [{"action": "notice", "lease": "L-1", "gpus": [0],
                        "until": until.isoformat()}]
    assert stopped["actions"] == [{"action": "stop", "lease": "L-1", "gpus": [0], "grace_s": 0}]
    assert Binding.objects.get(lease_ref="L-1").workload_state == "stopped"


def test_a_node_stops_being_asked_once_it_no_longer_serves_the_lease(nodes):
    a = nodes["node01"]
    bind("L-1", {a[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    services.unbind_lease(node=Node.objects.get(pk=a[0]), lease_ref="L-1")

    assert beat(a)["actions"] == []
    assert Binding.objects.get(lease_ref="L-1").stopped_at is not None


# --- logs -------------------------------------------------------------------------------------


def ship(node, lease="L-1", generation=1, from_line=0, lines=()):
    from rest_framework.test import APIClient
    node_id, token = node
    return APIClient().post(f"/api/v1/nodes/{node_id}/logs/",
                            {"lease": lease, "generation": generation, "from_line": from_line,
                             "lines": list(lines)}, format="json",
                            HTTP_AUTHORIZATION=f"Node {token}")


@pytest.fixture
def running(nodes):
    a = nodes["node01"]
    bind("L-1", {a[0]: [0]})
    beat(a, serving=["L-1"], workloads=[report(master_port=29500)])
    return a


def test_shipped_lines_are_read_back_in_order_and_tailed_with_the_cursor(running):
    assert ship(running, lines=["a", "b"]).json() == {"next_line": 2}
    first = workloads.read_log(lease_ref="L-1", node_rank=0, since=None)
    ship(running, from_line=1, lines=["b", "c", ""])  # a resend overlapping what is stored
    second = workloads.read_log(lease_ref="L-1", node_rank=0, since=first.cursor)

    assert (first.lines, first.node, first.dropped) == (["a", "b"], "node01", 0)
    assert (second.lines, second.dropped, second.more) == (["c", ""], 0, False)
    assert workloads.read_log(lease_ref="L-1", node_rank=0, since=second.cursor).lines == []


def test_lines_the_agent_lost_are_counted_as_dropped(running):
    ship(running, lines=["a"])
    ship(running, from_line=5, lines=["f"])

    page = workloads.read_log(lease_ref="L-1", node_rank=0, since=None)

    assert (page.lines, page.dropped) == (["a", "f"], 4)


def test_a_rank_keeps_only_its_last_lines_within_the_budget(running, settings):
    settings.WORKLOAD_LOG_BYTES = 10
    for start in range(0, 12, 3):
        ship(running, from_line=start, lines=[f"{n:03}" for n in range(start, start + 3)])

    page = workloads.read_log(lease_ref="L-1", node_rank=0, since=None)

    assert page.lines == ["009", "010", "011"]
    assert page.dropped == 9
    assert sum(WorkloadLog.objects.values_list("size_bytes", flat=True)) <= 10


def test_a_shipment_for_a_lease_the_node_does_not_run_is_a_404_and_stores_nothing(running, nodes):
    assert ship(nodes["node02"], lines=["x"]).status_code == 404
    assert ship(running, generation=7, lines=["x"]).status_code == 404
    assert not WorkloadLog.objects.exists()


def test_a_shipment_over_the_size_limit_is_a_400_naming_lines(running):
    response = ship(running, lines=["x" * 60_000] * 40)

    assert response.status_code == 400
    assert "lines" in response.json()["error"]["fields"]
    assert not WorkloadLog.objects.exists()


@pytest.mark.parametrize("lines", ["one line", [1, 2], ["a\x00b"], ["x" * 70_000]])
def test_malformed_lines_are_a_400_naming_lines_and_store_nothing(running, lines):
    response = ship(running, lines=lines) if not isinstance(lines, str) else \
        _ship_raw(running, {"lease": "L-1", "generation": 1, "from_line": 0, "lines": lines})

    assert response.status_code == 400
    assert "lines" in response.json()["error"]["fields"]
    assert not WorkloadLog.objects.exists()


def test_a_negative_from_line_is_a_400_naming_it(running):
    response = _ship_raw(running, {"lease": "L-1", "generation": 1, "from_line": -1, "lines": []})

    assert response.status_code == 400
    assert "from_line" in response.json()["error"]["fields"]


def _ship_raw(node, body):
    from rest_framework.test import APIClient
    node_id, token = node
    return APIClient().post(f"/api/v1/nodes/{node_id}/logs/", body, format="json",
                            HTTP_AUTHORIZATION=f"Node {token}")


def test_a_log_shipment_needs_the_nodes_token(running):
    node_id, token = running
    assert ship((node_id, token[:-3] + "xyz"), lines=["x"]).status_code == 401


def test_a_ranks_output_is_kept_for_days_after_its_node_stopped_serving_the_lease(running,
                                                                                   settings):
    settings.WORKLOAD_LOG_RETENTION_DAYS = 7
    ship(running, lines=["a", "b"])
    stopped_at = timezone.now()
    Binding.objects.filter(lease_ref="L-1").update(serve=False, stopped_at=stopped_at)

    kept = workloads.delete_old_logs(now=stopped_at + timedelta(days=6))
    deleted = workloads.delete_old_logs(now=stopped_at + timedelta(days=8))

    assert (kept, deleted) == (0, 1)
    assert not WorkloadLog.objects.exists()


# --- heartbeats answered early -------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_held_heartbeat_is_answered_as_soon_as_a_lease_is_bound_to_the_node(
        provider_client, fabric, monkeypatch):
    import threading
    import time

    services.ensure_gpu_catalogue()  # a transactional test starts from a flushed database
    body = provider_client.post("/api/v1/nodes/", node_body("node01"), format="json").json()
    node = (body["id"], body["token"])
    beat(node, runtime={"kind": "process", "address": "10.0.0.1"})
    waiting = threading.Event()
    real_wait = workloads.wait_for_work

    def wait_for_work(node_id, wait_s):
        waiting.set()  # the heartbeat has nothing to do and waits: now bind the lease
        return real_wait(node_id, wait_s)

    monkeypatch.setattr(workloads, "wait_for_work", wait_for_work)
    answers = []

    def held_heartbeat():
        try:
            answers.append(beat(node, wait_s=20))
        finally:
            connection.close()  # the thread's own connection

    held = threading.Thread(target=held_heartbeat)
    started = time.monotonic()
    held.start()
    assert waiting.wait(timeout=10)
    bind("L-9", {node[0]: [1]})  # a node that had no binding when its heartbeat came in
    held.join(timeout=25)

    assert [(a["action"], a["lease"]) for a in answers[0]["actions"]] == [("start", "L-9")]
    assert answers[0]["node_state"] == "active"
    assert time.monotonic() - started < 20


@pytest.mark.django_db(transaction=True)
def test_a_wake_that_brings_nothing_for_the_node_keeps_its_heartbeat_held(
        provider_client, fabric, monkeypatch):
    import time

    services.ensure_gpu_catalogue()
    body = provider_client.post("/api/v1/nodes/", node_body("node01"), format="json").json()
    node = (body["id"], body["token"])
    beat(node, runtime={"kind": "process", "address": "10.0.0.1"})
    real_wait, waits = workloads.wait_for_work, []

    def wait_for_work(node_id, wait_s):
        if not waits:
            workloads._push_wake([node_id])  # woken, say for a lease bound to another node
        waits.append(wait_s)
        return real_wait(node_id, wait_s)

    monkeypatch.setattr(workloads, "wait_for_work", wait_for_work)

    started = time.monotonic()
    answer = beat(node, wait_s=2)

    assert answer["actions"] == []
    assert len(waits) == 2  # woken once, then held again for what was left
    assert time.monotonic() - started >= 1.9

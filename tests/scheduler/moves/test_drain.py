from django.utils import timezone

from market import leasing
from market.models import Allocation, LeaseEvent
from notify import events
from notify.models import Event
from pool import services as pool
from pool.models import Binding, Node
from scheduler.moves import drain
from tests.scheduler.moves.test_remediation import active_lease, current_hosts, setup_market


def nodes_of(lease) -> set[int]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node_id", flat=True))


def test_a_node_drained_in_move_mode_loses_its_lease_to_a_node_of_the_same_leaf(db):
    client = setup_market()
    lease = active_lease(client, allow_moves=True)
    (node_id,) = nodes_of(lease)
    leaf = Node.objects.get(pk=node_id).host.leaf

    pool.drain_node(node=Node.objects.get(pk=node_id), actor="operator", mode="move")
    outcome = drain.drain_nodes()

    assert outcome["moved"] == [lease.pk]
    assert node_id not in nodes_of(lease) and len(nodes_of(lease)) == 1
    assert current_hosts(lease) == {leaf}
    event = LeaseEvent.objects.get(lease=lease, kind="moved")
    assert event.reason.startswith("node drained")
    events.sync_events()
    told = Event.objects.get(lease=lease, kind="lease.moved")
    assert told.payload["reason"].startswith("node drained")
    old = Binding.objects.get(node_id=node_id, lease_ref=f"L-{lease.pk}")
    assert old.serve is False
    assert Binding.objects.filter(lease_ref=f"L-{lease.pk}", serve=True).count() == 1


def test_a_drained_node_goes_offline_once_its_agent_stopped_the_last_lease(db):
    client = setup_market()
    lease = active_lease(client, allow_moves=True)
    (node_id,) = nodes_of(lease)
    node = Node.objects.get(pk=node_id)
    pool.drain_node(node=node, actor="operator", mode="move")

    first = drain.drain_nodes()
    pool.record_heartbeat(node=node, gpus=[{"index": i} for i in range(8)], ib_ports=[],
                          serving=[])  # the agent stopped the lease
    second = drain.drain_nodes()

    assert first["moved"] == [lease.pk] and first["offline"] == []
    assert second["offline"] == [node_id]
    node.refresh_from_db()
    assert node.state == "offline"
    assert node.state_changes.last().reason == "drained (move): no lease left"


def test_a_lease_that_did_not_allow_moves_runs_to_its_end_on_a_move_node(db):
    client = setup_market()
    lease = active_lease(client)  # on-demand: no consent by default
    (node_id,) = nodes_of(lease)

    pool.drain_node(node=Node.objects.get(pk=node_id), actor="operator", mode="move")
    outcome = drain.drain_nodes()

    assert outcome == {"moved": [], "waiting": [], "offline": []}
    assert nodes_of(lease) == {node_id}
    assert Node.objects.get(pk=node_id).state == "draining"


def test_run_to_end_leaves_the_lease_and_takes_no_new_lease_on_the_node(db):
    client = setup_market()
    lease = active_lease(client, allow_moves=True)
    (node_id,) = nodes_of(lease)

    pool.drain_node(node=Node.objects.get(pk=node_id), actor="operator", mode="run_to_end")
    outcome = drain.drain_nodes()
    others = [active_lease(client) for _ in range(3)]  # the three other nodes

    assert outcome["moved"] == [] and nodes_of(lease) == {node_id}
    assert all(node_id not in nodes_of(other) for other in others)
    refused = client.post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00"}, format="json").json()
    assert refused["lease"] is None  # the drained node's free GPUs are not offered


def test_a_lease_with_nowhere_to_go_waits_for_the_next_pass(db):
    client = setup_market()
    lease = active_lease(client, allow_moves=True)
    (node_id,) = nodes_of(lease)
    node = Node.objects.get(pk=node_id)
    blockers = [active_lease(client) for _ in range(3)]  # every other node is full

    pool.drain_node(node=node, actor="operator", mode="move")
    outcome = drain.drain_nodes()
    freed = nodes_of(blockers[0])
    leasing.terminate_lease(lease=blockers[0], actor="acme")  # a node frees up
    again = drain.drain_nodes()

    assert outcome["waiting"] == [lease.pk] and again["moved"] == [lease.pk]
    assert nodes_of(lease) == freed
    assert LeaseEvent.objects.filter(lease=lease, kind="moved").count() == 1

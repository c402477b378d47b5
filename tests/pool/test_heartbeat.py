from pool import services
from pool.models import Binding, Gpu, HealthEvent, Node, NodeStateChange
from tests.pool.conftest import heartbeat


def test_the_first_heartbeat_makes_the_node_active(registered):
    node_id, token = registered

    response = heartbeat(node_id, token)

    assert response.status_code == 200
    assert response.json() == {"interval_s": 15, "node_state": "active", "actions": []}
    node = Node.objects.get(pk=node_id)
    assert node.state == "active" and node.last_heartbeat_at is not None
    assert node.healthy_since is not None
    assert NodeStateChange.objects.filter(node=node, to_state="active").get().actor == "agent"


def test_a_wrong_token_is_refused_and_changes_nothing(registered):
    node_id, token = registered

    response = heartbeat(node_id, token[:-4] + "xxxx")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    node = Node.objects.get(pk=node_id)
    assert node.state == "registering" and node.last_heartbeat_at is None


def test_another_nodes_token_is_refused(provider_client, registered):
    from tests.pool.conftest import node_body

    node_id, _ = registered
    other = provider_client.post("/api/v1/nodes/", node_body("node02"), format="json").json()

    assert heartbeat(node_id, other["token"]).status_code == 401


def test_a_rotated_token_revokes_the_old_one(provider_client, registered):
    node_id, old = registered

    new = provider_client.post(f"/api/v1/nodes/{node_id}/rotate-token/").json()["token"]

    assert heartbeat(node_id, old).status_code == 401
    assert heartbeat(node_id, new).status_code == 200


def test_an_uncorrectable_ecc_error_fails_the_gpu_and_records_an_event(registered):
    node_id, token = registered
    heartbeat(node_id, token)
    gpus = [{"index": i, "temperature_c": 40} for i in range(8)]
    gpus[3]["ecc_errors"] = 2

    heartbeat(node_id, token, gpus=gpus)

    gpu = Gpu.objects.get(node_id=node_id, index=3)
    assert gpu.health == "failed"
    event = HealthEvent.objects.get(gpu=gpu)
    assert (event.from_value, event.to_value) == ("ok", "failed")
    assert "ECC" in event.detail
    assert Node.objects.get(pk=node_id).healthy_since is None


def test_xid_errors_or_heat_degrade_a_gpu_and_clean_counters_recover_it(registered):
    node_id, token = registered
    gpus = [{"index": i, "temperature_c": 40} for i in range(8)]
    gpus[1]["xid_errors"] = 3
    gpus[2]["temperature_c"] = 95
    heartbeat(node_id, token, gpus=gpus)

    heartbeat(node_id, token)

    transitions = list(HealthEvent.objects.order_by("id").values_list(
        "gpu__index", "from_value", "to_value"))
    assert transitions == [(1, "unknown", "degraded"), (2, "unknown", "degraded"),
                           (1, "degraded", "ok"), (2, "degraded", "ok")]


def test_an_unchanged_heartbeat_writes_no_events_and_few_queries(registered,
                                                                 django_assert_max_num_queries):
    node_id, token = registered
    heartbeat(node_id, token)
    events = HealthEvent.objects.count(), NodeStateChange.objects.count()

    with django_assert_max_num_queries(8):
        assert heartbeat(node_id, token).status_code == 200

    assert (HealthEvent.objects.count(), NodeStateChange.objects.count()) == events


def test_a_malformed_heartbeat_names_the_field(registered):
    node_id, token = registered

    response = heartbeat(node_id, token, gpus=[{"index": -1}])

    assert response.status_code == 400
    assert "gpus.0.index" in response.json()["error"]["fields"]


def test_the_answer_asks_the_node_to_start_a_bound_lease_until_it_serves_it(registered):
    node_id, token = registered
    node = Node.objects.get(pk=node_id)
    services.bind_lease(node=node, lease_ref="L-7", gpu_indexes=[1, 0])

    first = heartbeat(node_id, token).json()
    second = heartbeat(node_id, token, serving=["L-7"]).json()

    assert first["actions"] == [{"action": "start", "lease": "L-7", "gpus": [0, 1]}]
    assert first["interval_s"] == 1  # come back soon to acknowledge it
    assert second["actions"] == [] and second["interval_s"] == 15
    assert Binding.objects.get().acknowledged_at is not None


def test_the_answer_asks_the_node_to_stop_an_unbound_lease(registered):
    node_id, token = registered
    node = Node.objects.get(pk=node_id)
    services.bind_lease(node=node, lease_ref="L-7", gpu_indexes=[0])
    heartbeat(node_id, token, serving=["L-7"])
    services.unbind_lease(node=node, lease_ref="L-7")

    stop = heartbeat(node_id, token, serving=["L-7"]).json()["actions"]
    heartbeat(node_id, token, serving=[])

    assert stop == [{"action": "stop", "lease": "L-7", "gpus": [0], "grace_s": 30}]
    assert Binding.objects.get().stopped_at is not None

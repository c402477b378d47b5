import pytest

from pool.models import Gpu, Node, NodeStateChange
from tests.factories import client_for
from tests.pool.conftest import node_body


def test_a_provider_registers_a_node_on_a_host_of_its_fabric(provider_client, fabric):
    response = provider_client.post("/api/v1/nodes/", node_body(), format="json")

    body = response.json()
    assert response.status_code == 201, body
    assert body["state"] == "registering"
    assert body["token"].startswith("ibexnode_")
    assert [g["index"] for g in body["gpus"]] == list(range(8))
    assert {g["gpu_model"] for g in body["gpus"]} == {"H100-80GB"}
    assert NodeStateChange.objects.get().reason == "registered"


def test_the_node_token_is_stored_only_as_a_hash(provider_client, fabric):
    token = provider_client.post("/api/v1/nodes/", node_body(), format="json").json()["token"]

    node = Node.objects.get()
    assert token not in node.token_hash
    assert token not in str(provider_client.get(f"/api/v1/nodes/{node.id}/").json())


def test_bulk_registration_creates_every_node_or_none(provider_client, fabric):
    good = provider_client.post("/api/v1/nodes/bulk/", {"nodes": [
        node_body(f"node0{n}") for n in (1, 2, 3)]}, format="json")
    bad = provider_client.post("/api/v1/nodes/bulk/", {"nodes": [
        node_body("node04"), node_body("nope"), node_body("node05")]}, format="json")

    assert good.status_code == 201
    assert [n["hostname"] for n in good.json()["nodes"]] == ["node01", "node02", "node03"]
    assert len({n["token"] for n in good.json()["nodes"]}) == 3
    assert bad.status_code == 400
    assert list(bad.json()["error"]["fields"]) == ["nodes.1.hostname"]
    assert Node.objects.count() == 3


def test_bulk_validation_errors_name_the_item_and_field(provider_client, fabric):
    response = provider_client.post("/api/v1/nodes/bulk/", {"nodes": [
        node_body("node01"), node_body("node02", gpu_count=0)]}, format="json")

    assert response.status_code == 400
    assert "nodes.1.gpu_count" in response.json()["error"]["fields"]
    assert Node.objects.count() == 0


def test_registering_a_hostname_twice_is_a_conflict(provider_client, fabric):
    first = provider_client.post("/api/v1/nodes/", node_body(), format="json").json()

    again = provider_client.post("/api/v1/nodes/", node_body(), format="json")

    assert again.status_code == 409
    assert again.json()["error"]["code"] == "node_exists"
    assert str(first["id"]) in again.json()["error"]["message"]


def test_a_hostname_outside_the_fabric_is_refused(provider_client, fabric):
    response = provider_client.post("/api/v1/nodes/", node_body("gpu99"), format="json")

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {
        "hostname": ["'gpu99' is not a host of fabric 'lab'"]}


def test_a_provider_cannot_claim_a_host_of_another_providers_fabric(provider_client, fabric,
                                                                   rival_fabric):
    response = provider_client.post(
        "/api/v1/nodes/", node_body("rival01", fabric="rival-lab"), format="json")

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"fabric": ["you have no fabric 'rival-lab'"]}
    assert Node.objects.count() == 0


@pytest.mark.parametrize("change, field", [
    ({"gpu_count": 0}, "gpu_count"),
    ({"cpu_cores": -1}, "cpu_cores"),
    ({"memory_gib": "lots"}, "memory_gib"),
    ({"gpu_model": "GTX-1080"}, "gpu_model"),
    ({"colour": "blue"}, "colour"),
    ({"hostname": "bad host"}, "hostname"),
])
def test_bad_fields_are_refused_by_name_and_change_nothing(provider_client, fabric, change, field):
    response = provider_client.post("/api/v1/nodes/", node_body(**change), format="json")

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]
    assert Node.objects.count() == 0 and Gpu.objects.count() == 0


def test_a_tenant_cannot_register_nodes(tenant, fabric):
    response = client_for(tenant).post("/api/v1/nodes/", node_body(), format="json")

    assert response.status_code in (400, 403)
    assert Node.objects.count() == 0


def test_another_organisations_node_is_a_404(registered, rival_provider):
    node_id, _ = registered
    rival = client_for(rival_provider)

    assert rival.get(f"/api/v1/nodes/{node_id}/").status_code == 404
    assert rival.post(f"/api/v1/nodes/{node_id}/drain/").status_code == 404
    assert rival.post(f"/api/v1/nodes/{node_id}/rotate-token/").status_code == 404
    assert rival.get("/api/v1/nodes/").json()["results"] == []


def test_drain_moves_an_active_node_to_draining_with_history(provider_client, registered):
    from tests.pool.conftest import heartbeat

    node_id, token = registered
    heartbeat(node_id, token)

    response = provider_client.post(f"/api/v1/nodes/{node_id}/drain/")

    assert response.status_code == 200
    assert response.json()["state"] == "draining"
    assert list(NodeStateChange.objects.filter(node_id=node_id).values_list(
        "from_state", "to_state")) == [("", "registering"), ("registering", "active"),
                                       ("active", "draining")]


def test_draining_a_node_that_never_came_up_is_a_conflict(provider_client, registered):
    node_id, _ = registered

    response = provider_client.post(f"/api/v1/nodes/{node_id}/drain/")

    assert response.status_code == 409
    assert Node.objects.get(pk=node_id).state == "registering"


def test_gpu_models_list_the_current_catalogue(api_client, db):
    names = [m["name"] for m in api_client.get("/api/v1/gpu-models/").json()]

    assert {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB",
            "L40S-48GB"} <= set(names)


def test_listing_nodes_costs_the_same_queries_for_two_nodes_or_eight(
        provider_client, fabric):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def list_queries(count):
        provider_client.post("/api/v1/nodes/bulk/", {"nodes": [
            node_body(f"node0{n}") for n in range(1, count + 1)
            if not Node.objects.filter(hostname=f"node0{n}").exists()]}, format="json")
        with CaptureQueriesContext(connection) as queries:
            assert len(provider_client.get("/api/v1/nodes/").json()["results"]) == count
        return len(queries)

    assert list_queries(2) == list_queries(8)

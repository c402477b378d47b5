"""A GPU the agent does not report is not known to be healthy: it is `unknown` and not offered
until a heartbeat reports it; a node whose reported GPUs differ from its registration is
flagged for its provider and the operators."""

from pool import services
from pool.models import Gpu, HealthEvent, Node
from tests.factories import client_for
from tests.pool.conftest import heartbeat


def healths(node_id):
    return list(Gpu.objects.filter(node_id=node_id).order_by("index")
                .values_list("health", flat=True))


def offered(node_id):
    return services.offered_gpus().filter(node_id=node_id).count()


def test_a_registered_gpu_is_unknown_and_not_offered_before_any_heartbeat(registered, verified):
    node_id, _ = registered

    assert healths(node_id) == ["unknown"] * 8
    assert offered(node_id) == 0


def test_a_node_whose_agent_reports_no_gpus_is_not_offered_and_is_flagged(registered, verified):
    node_id, token = registered

    heartbeat(node_id, token, gpus=[])  # what `ibex-agent run` sends without NVML

    node = Node.objects.get(pk=node_id)
    assert node.state == "active"  # it answers, but sells nothing
    assert healths(node_id) == ["unknown"] * 8 and offered(node_id) == 0
    assert node.healthy_since is None
    assert node.inventory_mismatch == (
        "the agent reports 0 of 8 registered GPUs; missing: gpu0, gpu1, gpu2, gpu3, gpu4, "
        "gpu5, gpu6, gpu7")
    assert HealthEvent.objects.filter(node=node, kind="inventory", to_value="mismatch").exists()


def test_a_complete_heartbeat_makes_the_gpus_known_and_offered(registered, verified):
    node_id, token = registered
    heartbeat(node_id, token, gpus=[])

    heartbeat(node_id, token)

    node = Node.objects.get(pk=node_id)
    assert healths(node_id) == ["ok"] * 8 and offered(node_id) == 8
    assert node.inventory_mismatch == "" and node.healthy_since is not None
    assert HealthEvent.objects.filter(node=node, kind="inventory", to_value="agrees").exists()


def test_a_gpu_that_stops_being_reported_becomes_unknown_and_is_no_longer_offered(
        registered, verified):
    node_id, token = registered
    heartbeat(node_id, token)
    heartbeat(node_id, token)  # steady: the fast path

    heartbeat(node_id, token, gpus=[{"index": i, "temperature_c": 40} for i in range(7)])

    assert healths(node_id) == ["ok"] * 7 + ["unknown"]
    assert offered(node_id) == 7
    assert "missing: gpu7" in Node.objects.get(pk=node_id).inventory_mismatch
    assert HealthEvent.objects.get(gpu__index=7).to_value == "unknown"


def test_a_gpu_reported_but_not_registered_is_flagged(registered, verified):
    node_id, token = registered

    heartbeat(node_id, token, gpus=[{"index": i, "temperature_c": 40} for i in range(9)])

    assert Node.objects.get(pk=node_id).inventory_mismatch == (
        "the agent reports 8 of 8 registered GPUs; not registered: gpu8")


def test_the_provider_sees_the_mismatch_on_its_node(registered, verified, provider):
    node_id, token = registered
    heartbeat(node_id, token, gpus=[])

    body = client_for(provider).get(f"/api/v1/nodes/{node_id}/").json()

    assert body["inventory_mismatch"].startswith("the agent reports 0 of 8")
    assert {g["health"] for g in body["gpus"]} == {"unknown"}

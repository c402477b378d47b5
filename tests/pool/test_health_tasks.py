import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from ibex.accounts.models import ProviderProfile
from pool import services
from pool.models import Gpu, HealthEvent, Node
from tests.factories import client_for
from tests.pool.conftest import heartbeat


def silence(node_id: int, seconds: int) -> None:
    Node.objects.filter(pk=node_id).update(
        last_heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def test_a_node_silent_for_three_intervals_becomes_unreachable(registered):
    node_id, token = registered
    heartbeat(node_id, token)
    silence(node_id, 46)

    assert services.mark_unreachable_nodes() == [node_id]

    node = Node.objects.get(pk=node_id)
    assert node.health == "unreachable" and node.healthy_since is None
    assert HealthEvent.objects.get().kind == "node_unreachable"


def test_a_node_silent_for_less_than_three_intervals_stays_reachable(registered):
    node_id, token = registered
    heartbeat(node_id, token)
    silence(node_id, 40)

    assert services.mark_unreachable_nodes() == []
    assert Node.objects.get(pk=node_id).health == "reachable"


def test_the_next_heartbeat_makes_an_unreachable_node_reachable(registered):
    node_id, token = registered
    heartbeat(node_id, token)
    silence(node_id, 100)
    services.mark_unreachable_nodes()

    heartbeat(node_id, token)

    assert Node.objects.get(pk=node_id).health == "reachable"
    assert list(HealthEvent.objects.values_list("kind", flat=True)) == [
        "node_unreachable", "node_reachable"]


@pytest.mark.django_db(transaction=True)
def test_two_overlapping_beats_mark_each_silent_node_once(provider, fabric):
    services.ensure_gpu_catalogue()  # a transactional test starts from a flushed database
    client = client_for(provider)
    from tests.pool.conftest import node_body

    nodes = client.post("/api/v1/nodes/bulk/", {"nodes": [
        node_body(f"node0{n}") for n in range(1, 9)]}, format="json").json()["nodes"]
    for node in nodes:
        heartbeat(node["id"], node["token"])
        silence(node["id"], 100)
    claimed: list[list[int]] = []
    barrier = threading.Barrier(2)

    def beat():
        barrier.wait()
        try:
            claimed.append(services.mark_unreachable_nodes())
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(i for batch in claimed for i in batch) == sorted(n["id"] for n in nodes)
    assert HealthEvent.objects.filter(kind="node_unreachable").count() == 8


def test_a_provider_is_verified_after_its_nodes_stay_healthy_for_the_burn_in(
        provider, registered, settings):
    settings.PROVIDER_BURN_IN_S = 600
    node_id, token = registered
    heartbeat(node_id, token)

    assert services.verify_burned_in_providers() == []
    later = timezone.now() + timedelta(seconds=601)
    assert services.verify_burned_in_providers(now=later) == ["hpc-provider"]

    profile = ProviderProfile.objects.get(organization=provider)
    assert profile.state == "verified"
    assert profile.changes.get().actor == "system"


def test_a_provider_with_an_unhealthy_gpu_is_not_verified(provider, registered):
    node_id, token = registered
    gpus = [{"index": i} for i in range(8)]
    gpus[0]["ecc_errors"] = 1
    heartbeat(node_id, token, gpus=gpus)

    later = timezone.now() + timedelta(days=1)

    assert services.verify_burned_in_providers(now=later) == []
    assert ProviderProfile.objects.get(organization=provider).state == "pending"


def test_only_verified_providers_healthy_gpus_are_offered(provider, registered, verified, tenant):
    node_id, token = registered
    gpus = [{"index": i} for i in range(8)]
    gpus[5]["ecc_errors"] = 1
    heartbeat(node_id, token, gpus=gpus)

    offered = client_for(tenant).get("/api/v1/gpus/").json()["results"]

    assert len(offered) == 7
    assert all("hostname" not in gpu for gpu in offered)
    assert {gpu["gpu_model"] for gpu in offered} == {"H100-80GB"}


def test_an_unverified_providers_gpus_are_not_offered(registered, tenant):
    node_id, token = registered
    heartbeat(node_id, token)

    assert client_for(tenant).get("/api/v1/gpus/").json()["results"] == []


def test_providers_filter_their_gpus_by_model_health_state_fabric_and_leaf(
        provider_client, registered):
    node_id, token = registered
    gpus = [{"index": i} for i in range(8)]
    gpus[2]["xid_errors"] = 1
    heartbeat(node_id, token, gpus=gpus)
    leaf = Node.objects.get(pk=node_id).host.leaf

    def count(query):
        return len(provider_client.get(f"/api/v1/gpus/?{query}").json()["results"])

    assert count("health=degraded") == 1
    assert count("model=H100-80GB") == 8
    assert count("model=A100-80GB") == 0
    assert count("state=active") == 8
    assert count("fabric=lab") == 8
    assert count(f"leaf={leaf}") == 8
    assert count("leaf=elsewhere") == 0
    assert Gpu.objects.count() == 8

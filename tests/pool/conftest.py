import pytest
from rest_framework.test import APIClient

from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts import services as accounts


@pytest.fixture
def fabric(provider):
    spec = generators.fat_tree(8, 8, tiers=2)  # node1..node8, 4 hosts per leaf
    return fabric_services.save_fabric(owner=provider, name="lab", spec=spec,
                                       source="generator").fabric


@pytest.fixture
def rival_fabric(rival_provider):
    spec = generators.fat_tree(4, 8, tiers=2, prefix="rival")
    return fabric_services.save_fabric(owner=rival_provider, name="rival-lab", spec=spec,
                                       source="generator").fabric


def node_body(hostname="node01", **extra):
    return {"hostname": hostname, "fabric": "lab", "gpu_model": "H100-80GB", "gpu_count": 8,
            "cpu_cores": 128, "memory_gib": 2048, **extra}


@pytest.fixture
def registered(provider_client, fabric):
    """A node on node01, registered through the API: (node id, token)."""
    body = provider_client.post("/api/v1/nodes/", node_body(), format="json").json()
    return body["id"], body["token"]


def heartbeat(node_id, token, gpus=None, serving=(), **extra):
    client = APIClient()
    gpus = gpus if gpus is not None else [{"index": i, "temperature_c": 40} for i in range(8)]
    return client.post(f"/api/v1/nodes/{node_id}/heartbeat/",
                       {"gpus": gpus, "serving": list(serving), **extra}, format="json",
                       HTTP_AUTHORIZATION=f"Node {token}")


@pytest.fixture
def verified(provider):
    accounts.change_provider_state(organization=provider, to_state="verified", actor="test",
                                   reason="audit")
    return provider

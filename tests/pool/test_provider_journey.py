"""From a new organisation to GPUs offered to tenants, through the API alone."""

from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from pool import tasks
from tests.factories import client_for, make_org

TOPOLOGY = "SwitchName=leaf1 Nodes=gpu[01-02] LinkSpeed=400\n"


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_a_new_provider_reaches_offered_gpus_through_the_api(db, settings):
    settings.PROVIDER_BURN_IN_S = 0
    tenant = client_for(make_org("acme-ai", "tenant"))
    signed_up = APIClient().post("/api/v1/orgs/", {
        "slug": "new-gpus", "name": "New GPUs", "roles": ["provider"], "username": "ada",
        "email": "ada@example.com", "password": "a-long-Passw0rd!"}, format="json").json()
    provider = bearer(signed_up["api_key"])

    imported = provider.post("/api/v1/fabrics/import/", {
        "file": SimpleUploadedFile("topology.conf", TOPOLOGY.encode()), "format": "slurm",
        "name": "new-lab"}, format="multipart")
    nodes = provider.post("/api/v1/nodes/bulk/", {"nodes": [
        {"hostname": h, "fabric": "new-lab", "gpu_model": "H200-141GB", "gpu_count": 8,
         "cpu_cores": 96, "memory_gib": 2048} for h in ("gpu01", "gpu02")]}, format="json")
    before_burn_in = len(tenant.get("/api/v1/gpus/").json()["results"])
    for node in nodes.json()["nodes"]:
        APIClient().post(f"/api/v1/nodes/{node['id']}/heartbeat/",
                         {"gpus": [{"index": i, "temperature_c": 35} for i in range(8)]},
                         format="json", HTTP_AUTHORIZATION=f"Node {node['token']}")
    tasks.verify_burned_in_providers()

    assert imported.status_code == 201
    assert nodes.status_code == 201
    assert before_burn_in == 0
    assert provider.get("/api/v1/provider/").json()["state"] == "verified"
    offered = tenant.get("/api/v1/gpus/?model=H200-141GB&page_size=100").json()["results"]
    assert len(offered) == 16
    assert all("hostname" not in gpu for gpu in offered)

"""A provider corrects its node's description with PATCH; where a node is (fabric, hostname)
never changes, its GPUs only while no lease holds them, and nobody else may touch it."""

from datetime import timedelta

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
from django.utils import timezone

from ibex.accounts.models import ProviderProfile
from market.models import Allocation, Lease
from pool.models import Gpu, Node
from tests.factories import client_for, make_org
from tests.pool.conftest import heartbeat


def test_the_owner_corrects_cpu_cores_and_memory(provider_client, registered):
    node_id, _ = registered

    response = provider_client.patch(f"/api/v1/nodes/{node_id}/",
                                     {"cpu_cores": 96, "memory_gib": 1536}, format="json")

    assert response.status_code == 200
    assert (response.json()["cpu_cores"], response.json()["memory_gib"]) == (96, 1536)
    node = Node.objects.get(pk=node_id)
    assert (node.cpu_cores, node.memory_gib) == (96, 1536)


def test_fabric_and_hostname_are_refused_naming_the_field(provider_client, registered):
    node_id, _ = registered

    for field, value in (("hostname", "node02"), ("fabric", "other")):
        response = provider_client.patch(f"/api/v1/nodes/{node_id}/", {field: value},
                                         format="json")
        assert response.status_code == 400 and field in response.json()["error"]["fields"]
    assert Node.objects.get(pk=node_id).hostname == "node01"


def test_the_gpu_count_changes_while_no_lease_holds_the_node(provider_client, registered):
    node_id, token = registered

    response = provider_client.patch(f"/api/v1/nodes/{node_id}/", {"gpu_count": 4},
                                     format="json")

    assert response.status_code == 200 and len(response.json()["gpus"]) == 4
    assert Gpu.objects.filter(node_id=node_id).count() == 4


def test_the_gpus_do_not_change_while_leased(provider_client, registered, provider):
    node_id, token = registered
    ProviderProfile.objects.filter(organization=provider).update(state="verified")
    heartbeat(node_id, token)
    tenant = make_org("acme-ai", "tenant")
    now = timezone.now()
    lease = Lease.objects.create(tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
                                 gpu_count=1, price_micros=1, max_price_micros=1,
                                 starts_at=now, ends_at=now + timedelta(hours=1))
    Allocation.objects.create(lease=lease, gpu=Gpu.objects.filter(node_id=node_id).first(),
                              price_micros=1, period=DateTimeTZRange(now, now + timedelta(hours=1)))

    for change in ({"gpu_count": 4}, {"gpu_model": "A100-80GB"}):
        response = provider_client.patch(f"/api/v1/nodes/{node_id}/", change, format="json")
        assert response.status_code == 400
        assert next(iter(change)) in response.json()["error"]["fields"]
    assert Gpu.objects.filter(node_id=node_id).count() == 8


def test_another_provider_gets_a_404_and_changes_nothing(registered, rival_provider):
    node_id, _ = registered

    response = client_for(rival_provider).patch(f"/api/v1/nodes/{node_id}/",
                                                {"cpu_cores": 1}, format="json")

    assert response.status_code == 404
    assert Node.objects.get(pk=node_id).cpu_cores == 128


def test_a_tenant_gets_no_node_to_patch(registered, tenant):
    node_id, _ = registered

    response = client_for(tenant).patch(f"/api/v1/nodes/{node_id}/", {"cpu_cores": 1},
                                        format="json")

    assert response.status_code in (403, 404)
    assert Node.objects.get(pk=node_id).cpu_cores == 128

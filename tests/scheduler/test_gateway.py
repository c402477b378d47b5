"""`POST /api/v1/gateway/heartbeat/`: a Slurm gateway's one report of all its fabric's nodes,
and the reservations it is answered with (the gateway itself: tests/agent/slurm)."""

import pytest

from fabric.models import Fabric
from market.models import Lease
from pool.models import Gpu, HealthEvent, Node
from scheduler.gateway import reservations_of
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes

URL = "/api/v1/gateway/heartbeat/"
HOSTS = ("hpc-provider-01", "hpc-provider-02", "hpc-provider-03", "hpc-provider-04")

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider():
    return provider_with_nodes()


def report(**changes) -> dict:
    nodes = [{"hostname": host, "gpus": list(range(8))} for host in HOSTS]
    return {"fabric": "lab", "kind": "slurm", "status": "ok", "nodes": nodes, **changes}


def test_a_report_keeps_every_node_reachable_and_answers_the_interval(provider):
    answer = client_for(provider).post(URL, report(), format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json() == {"interval_s": 15, "reservations": [], "unregistered": []}
    fabric = Fabric.objects.get(name="lab")
    assert (fabric.gateway, fabric.gateway_status) == ("slurm", "ok")
    assert set(Node.objects.values_list("runtime", flat=True)) == {"slurm"}
    assert Node.objects.filter(last_heartbeat_at__isnull=False).count() == 4


def test_a_node_slurm_has_drained_has_every_gpu_failed_with_slurms_reason(provider):
    nodes = report()["nodes"]
    nodes[1]["down"] = "DRAIN+IDLE: fan failure"
    assert client_for(provider).post(URL, report(nodes=nodes), format="json").status_code == 200
    failed = Gpu.objects.filter(health="failed")
    assert set(failed.values_list("node__hostname", flat=True)) == {HOSTS[1]}
    assert failed.count() == 8
    event = HealthEvent.objects.filter(kind="gpu_health", to_value="failed").first()
    assert event.detail == "Slurm: DRAIN+IDLE: fan failure"


def test_gpus_running_jobs_outside_ibex_are_busy_not_offered_and_free_again_after(provider):
    nodes = report()["nodes"]
    nodes[0]["busy"] = [{"index": 2, "reason": "job 17 of alice"}]
    client = client_for(provider)
    assert client.post(URL, report(nodes=nodes), format="json").status_code == 200
    busy = Gpu.objects.get(health="busy")
    assert (busy.node.hostname, busy.index) == (HOSTS[0], 2)
    assert busy.node.healthy_since is not None  # busy is not broken
    assert not HealthEvent.objects.filter(kind="gpu_health").exists()
    assert client.post(URL, report(), format="json").status_code == 200
    assert not Gpu.objects.filter(health="busy").exists()


def test_hosts_with_no_node_are_answered_for_registration(provider):
    nodes = [*report()["nodes"], {"hostname": "n999", "gpus": [0]}]
    answer = client_for(provider).post(URL, report(nodes=nodes), format="json")
    assert answer.json()["unregistered"] == ["n999"]


def test_slurm_unreachable_is_the_fabrics_status_and_marks_no_node_down(provider):
    answer = client_for(provider).post(
        URL, report(status="slurm unreachable: Unable to contact slurm controller"),
        format="json")
    assert answer.status_code == 200
    assert Fabric.objects.get(name="lab").gateway_status.startswith("slurm unreachable")
    assert not Gpu.objects.exclude(health="ok").exists()


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "pbs"}, "kind"),
    ({"nodes": [{"hostname": "x", "gpus": [99]}]}, "nodes"),
    ({"nodes": "all"}, "nodes"),
    ({"refused": [{"lease": "L-1"}]}, "refused"),
    ({"surprise": 1}, "surprise"),
])
def test_a_bad_report_is_a_400_naming_the_field_and_changes_nothing(provider, body, field):
    answer = client_for(provider).post(URL, report(**body), format="json")
    assert answer.status_code == 400
    assert any(name.startswith(field) for name in answer.json()["error"]["fields"]), answer.json()
    assert Fabric.objects.get(name="lab").gateway == ""


def test_only_the_fabrics_owner_reports_it(provider):
    other = make_org("other-provider", "provider")
    answer = client_for(other).post(URL, report(), format="json")
    assert answer.status_code == 404
    assert "you have no fabric 'lab'" in answer.json()["error"]["message"]
    tenant = make_org("acme-ai", "tenant")
    assert client_for(tenant).post(URL, report(), format="json").status_code == 403


def test_no_binding_means_no_reservation(provider):
    assert reservations_of(Fabric.objects.get(name="lab"), now=None) == []
    assert not Lease.objects.exists()

"""`POST /api/v1/gateway/heartbeat/`: a Slurm gateway's one report of all its fabric's nodes,
and the reservations it is answered with (the gateway itself: tests/agent/slurm)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services as money
from fabric.models import Fabric
from ibex.outbox.models import OutboxMessage
from market import prices
from market.models import Allocation, Lease
from pool.models import Binding, Gpu, HealthEvent, Node
from scheduler import placing
from scheduler.gateway import avoided_nodes, reservation_refused, reservations_of
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


def test_a_node_resumed_in_slurm_is_healthy_again(provider):
    nodes = report()["nodes"]
    nodes[1]["down"] = "DOWN: not responding"
    client = client_for(provider)
    assert client.post(URL, report(nodes=nodes), format="json").status_code == 200
    assert client.post(URL, report(), format="json").status_code == 200
    assert set(Gpu.objects.values_list("health", flat=True)) == {"ok"}


def test_a_quiet_report_costs_the_same_few_queries_however_many_nodes(
        provider, django_assert_max_num_queries):
    client = client_for(provider)
    assert client.post(URL, report(), format="json").status_code == 200
    with django_assert_max_num_queries(12):  # auth, fabric, nodes, one UPDATE, bindings...
        assert client.post(URL, report(), format="json").status_code == 200
    assert Node.objects.filter(health="reachable", healthy_since__isnull=False).count() == 4


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


def placed_lease(provider, gpus=16, account="physics") -> Lease:
    """A lease for `account` bound to its nodes (placing, not yet acknowledged)."""
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("physics-lab", "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    body = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "2.00", "slurm_account": account}, format="json").json()
    return placing.place_lease(lease_id=body["lease"])


def test_a_bound_lease_is_one_reservation_on_its_nodes_for_its_account_until_it_ends(provider):
    lease = placed_lease(provider)
    fabric = Fabric.objects.get(name="lab")
    (wanted,) = reservations_of(fabric, timezone.now())
    hosts = set(Binding.objects.filter(lease_ref=lease.reference).values_list(
        "node__hostname", flat=True))
    assert wanted == {"name": f"ibex-lease-{lease.pk}", "lease": lease.reference,
                      "account": "physics", "ends_at": lease.ends_at.isoformat(),
                      "nodes": {host: list(range(8)) for host in sorted(hosts)}}


def test_a_preempted_leases_reservation_ends_with_its_notice(provider):
    lease = placed_lease(provider)
    notice_end = timezone.now() + timedelta(minutes=2)
    Binding.objects.filter(lease_ref=lease.reference).update(notice_until=notice_end)
    (wanted,) = reservations_of(Fabric.objects.get(name="lab"), timezone.now())
    assert wanted["ends_at"] == notice_end.isoformat()


def test_a_refused_reservation_places_the_lease_again_off_those_nodes(provider):
    lease = placed_lease(provider, gpus=8)
    node_id = Binding.objects.get(lease_ref=lease.reference).node_id
    done = reservation_refused(fabric=Fabric.objects.get(name="lab"), lease_ref=lease.reference,
                               message="Requested reservation overlaps with another reservation")
    lease.refresh_from_db()
    assert done == "placed again" and lease.state == "pending"
    assert not Allocation.objects.filter(lease=lease).exists()
    assert not Binding.objects.filter(lease_ref=lease.reference, serve=True).exists()
    assert avoided_nodes(lease.pk) == {node_id}
    assert lease.events.last().reason == ("Slurm refused its reservation: Requested reservation "
                                          "overlaps with another reservation: placed again")
    assert OutboxMessage.objects.filter(task="scheduler.place_lease", args=[lease.pk]).exists()
    lease = placing.place_lease(lease_id=lease.pk)
    assert lease.state == "placing"
    assert Binding.objects.get(lease_ref=lease.reference, serve=True).node_id != node_id


def test_a_lease_slurm_keeps_refusing_fails_with_slurms_message(provider, settings):
    settings.PLACEMENT_ATTEMPTS = 1
    lease = placed_lease(provider, gpus=8)
    fabric = Fabric.objects.get(name="lab")
    assert reservation_refused(fabric=fabric, lease_ref=lease.reference,
                               message="Invalid account") == "placed again"
    lease = placing.place_lease(lease_id=lease.pk)
    assert reservation_refused(fabric=fabric, lease_ref=lease.reference,
                               message="Invalid account") == "failed"
    lease.refresh_from_db()
    assert lease.state == "failed"
    assert lease.events.last().reason == "Slurm refused its reservation: Invalid account"


def test_an_active_leases_refused_update_is_recorded_once_and_changes_nothing(provider):
    lease = placed_lease(provider, gpus=8)
    Lease.objects.filter(pk=lease.pk).update(state="active")
    fabric = Fabric.objects.get(name="lab")
    for _ in range(3):
        assert reservation_refused(fabric=fabric, lease_ref=lease.reference,
                                   message="Requested nodes are busy") == "recorded"
    assert lease.events.filter(kind="reservation_refused").count() == 1
    assert Allocation.objects.filter(lease=lease).count() == 8


def test_no_binding_means_no_reservation(provider):
    assert reservations_of(Fabric.objects.get(name="lab"), timezone.now()) == []
    assert not Lease.objects.exists()

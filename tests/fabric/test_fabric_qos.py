"""Bandwidth classes on a fabric: the provider's QoS settings (PATCH `qos`, shown in the
fabric's JSON), each lease's class on its partition, and the fabric agent's answer carrying
the opensm.conf options and each P_Key's SL."""

import pytest
from django.db.models import Count
from django.utils import timezone

from fabric import services as fabric_services
from fabric.core import qos
from fabric.models import Fabric, Partition
from ibex.accounts.models import Organization
from market.models import Allocation, Lease
from pool import services as pool
from pool.models import Binding, Node
from scheduler import placing
from scheduler.moves import remediation
from tests.factories import client_for
from tests.scheduler.moves.test_remediation import active_lease, setup_market

pytestmark = pytest.mark.django_db


@pytest.fixture
def provider_client():
    setup_market()
    fabric = Fabric.objects.get()
    return client_for(fabric.owner), fabric


def tenant_client():
    return client_for(Organization.objects.get(slug="acme-ai"))


def lease_of_class(client, bandwidth: dict, gpus: int = 16, topology=None,
                   allow_moves=None) -> Lease:
    order = {"gpu_models": ["H100-80GB"], "gpus": gpus, "hours": 2, "tier": "on_demand",
             "max_price_per_gpu_hour": "3.00", "topology": topology or {"required": "leaf"},
             "bandwidth": bandwidth}
    if allow_moves is not None:
        order["allow_moves"] = allow_moves
    body = client.post("/api/v1/orders/", order, format="json")
    assert body.status_code == 201, body.content
    lease = Lease.objects.get(pk=body.json()["lease"])
    placing.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=lease.created_at)
    placing.activate_acknowledged_leases()
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def agents_answer(fabric) -> dict:
    return fabric_services.record_fabric_report(
        provider=fabric.owner, fabric_name=fabric.name,
        report={"version": 1, "observed_at": timezone.now(), "reachable": False,
                "error": "down"})


def test_the_fabric_shows_ibexs_default_classes_until_the_provider_sets_its_own(provider_client):
    client, fabric = provider_client

    shown = client.get(f"/api/v1/fabrics/{fabric.pk}/").json()["qos"]

    assert shown["classes"] == {"guaranteed": {"sl": 1, "vl": 1}, "standard": {"sl": 0, "vl": 0},
                                "scavenger": {"sl": 2, "vl": 2}}
    assert shown["vlarb_high"] == {"1": 255} and shown["vlarb_low"] == {"0": 64, "2": 4}
    assert shown["max_vls"] == 4 and shown["high_limit"] == 255
    assert shown["sl2vl"] == [0, 1, 2] + [0] * 13


def test_the_provider_changes_weights_and_a_class_and_the_rest_stays(provider_client):
    client, fabric = provider_client

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/", {"qos": {
        "vlarb_low": {"0": 32, "2": 8}, "classes": {"scavenger": {"sl": 7}}}}, format="json")

    assert answer.status_code == 200, answer.content
    shown = answer.json()["qos"]
    assert shown["vlarb_low"] == {"0": 32, "2": 8} and shown["vlarb_high"] == {"1": 255}
    assert shown["classes"]["scavenger"] == {"sl": 7, "vl": 2}
    assert shown["sl2vl"][7] == 2 and shown["sl2vl"][2] == 0
    assert client.get(f"/api/v1/fabrics/{fabric.pk}/").json()["qos"] == shown
    assert agents_answer(fabric)["qos"]["options"]["qos_vlarb_low"] == "0:32,2:8"


@pytest.mark.parametrize("body,field", [
    ({"qos": {"classes": {"guaranteed": {"sl": 16}}}}, "qos.classes.guaranteed.sl"),
    ({"qos": {"classes": {"scavenger": {"sl": 1}}}}, "qos.classes.scavenger.sl"),
    ({"qos": {"classes": {"platinum": {"sl": 4, "vl": 1}}}}, "qos.classes.platinum"),
    ({"qos": {"vlarb_low": {"0": 300, "2": 4}}}, "qos.vlarb_low.0"),
    ({"qos": {"vlarb_high": {"6": 10, "1": 255}}}, "qos.vlarb_high.6"),
    ({"qos": {"classes": {"guaranteed": {"vl": 3}}}}, "qos.classes.guaranteed.vl"),
    ({"qos": {"max_vls": 9}}, "qos.max_vls"),
    ({"qos": "fast"}, "qos"),
    # both or neither: a good QoS change with a bad range changes nothing
    ({"qos": {"vlarb_low": {"0": 1, "2": 1}}, "pkey_range": {"first": "0x3000", "last": "0x2"}},
     "pkey_range.last"),
])
def test_a_bad_qos_setting_is_refused_naming_the_field_and_nothing_changes(
        provider_client, body, field):
    client, fabric = provider_client

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/", body, format="json")

    assert answer.status_code == 400, answer.content
    assert field in answer.json()["error"]["fields"], answer.json()
    fabric.refresh_from_db()
    assert fabric.qos == {} and (fabric.pkey_first, fabric.pkey_last) == (0x1000, 0x7FFE)


def test_a_tenant_cannot_change_a_fabrics_classes(provider_client):
    _client, fabric = provider_client

    answer = tenant_client().patch(f"/api/v1/fabrics/{fabric.pk}/",
                                   {"qos": {"max_vls": 8}}, format="json")

    assert answer.status_code in (403, 404)
    fabric.refresh_from_db()
    assert fabric.qos == {}


def test_each_partition_takes_its_leases_class_and_the_answer_maps_its_pkey_to_that_sl(
        provider_client):
    _client, fabric = provider_client
    tenant = tenant_client()
    guaranteed = lease_of_class(tenant, {"class": "guaranteed", "gbps_per_gpu": 5})
    scavenger = lease_of_class(tenant, {"class": "scavenger"})

    answer = agents_answer(fabric)

    classes = dict(Partition.objects.filter(released_at__isnull=True)
                   .values_list("holder", "bandwidth_class"))
    assert classes == {guaranteed.reference: "guaranteed", scavenger.reference: "scavenger"}
    pkeys = {entry["pkey"]: (entry["class"], entry["sl"]) for entry in answer["qos"]["pkeys"]}
    assert pkeys == {"0x1000": ("guaranteed", 1), "0x1001": ("scavenger", 2)}
    assert answer["qos"]["default_sl"] == 0
    assert answer["qos"]["options"] == qos.opensm_options(qos.settings_of({}))


def test_a_lease_whose_order_names_no_class_is_standard(provider_client):
    _client, fabric = provider_client

    lease = active_lease(tenant_client(), gpus=16)

    assert Partition.objects.get(holder=lease.reference).bandwidth_class == "standard"
    assert [(e["class"], e["sl"]) for e in agents_answer(fabric)["qos"]["pkeys"]] == \
        [("standard", 0)]


def test_a_guaranteed_lease_moved_to_another_node_keeps_its_class(provider_client):
    _client, _fabric = provider_client
    lease = lease_of_class(tenant_client(), {"class": "guaranteed", "gbps_per_gpu": 25}, gpus=9,
                           topology={"required": "spine"}, allow_moves=True)  # 8 + 1
    lone = (Allocation.objects.filter(lease=lease).values("gpu__node").order_by()
            .annotate(n=Count("id")).order_by("n").first())["gpu__node"]

    # every GPU of the node holding its one GPU fails: it must move to another node
    pool.record_heartbeat(node=Node.objects.get(pk=lone),
                          gpus=[{"index": i, "ecc_errors": 1} for i in range(8)],
                          ib_ports=[], serving=[])
    outcome = remediation.remediate_leases()

    assert outcome == {lease.pk: "moved"}
    partition = Partition.objects.get(holder=lease.reference, released_at__isnull=True)
    assert partition.bandwidth_class == "guaranteed"

"""A partition per lease: every lease on more than one node gets its own P_Key of its fabric's
range while it lives, the lease JSON shows it, the fabric agent's answer lists its members, and
PostgreSQL keeps a P_Key in one live lease of a fabric however placements race."""

import threading

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from fabric import services as fabric_services
from fabric.models import Fabric, Host, Partition
from ibex.accounts.models import Organization
from market.models import Allocation
from pool import services as pool
from pool.models import Node
from scheduler import placing
from scheduler.moves import remediation
from tests.factories import client_for
from tests.scheduler.moves.test_remediation import active_lease, setup_market

pytestmark = pytest.mark.django_db


def live_pkeys() -> dict[str, int]:
    return dict(Partition.objects.filter(released_at__isnull=True).values_list("holder", "pkey"))


def test_a_lease_on_two_nodes_gets_the_first_pkey_of_the_range_and_shows_it():
    client = setup_market()

    lease = active_lease(client, gpus=16, topology={"required": "leaf"})
    body = client.get(f"/api/v1/leases/{lease.pk}/").json()

    assert body["fabric"]["pkey"] == "0x1000"
    partition = Partition.objects.get(holder=lease.reference, released_at__isnull=True)
    assert set(partition.hosts.values_list("name", flat=True)) == set(
        Allocation.objects.filter(lease=lease).values_list("gpu__node__host__name", flat=True))
    assert len(partition.hosts.all()) == 2


def test_a_lease_on_one_node_has_no_partition():
    client = setup_market()

    lease = active_lease(client, gpus=8)

    assert client.get(f"/api/v1/leases/{lease.pk}/").json()["fabric"]["pkey"] is None
    assert not Partition.objects.exists()


def test_two_leases_on_several_nodes_get_distinct_pkeys_and_the_list_shows_them():
    client = setup_market()

    first = active_lease(client, gpus=16)
    second = active_lease(client, gpus=16)
    listed = {item["id"]: item["fabric"]["pkey"] for item in
              client.get("/api/v1/leases/").json()["results"]}

    assert listed == {first.pk: "0x1000", second.pk: "0x1001"}


def test_an_ended_lease_gives_its_pkey_back_and_the_next_lease_may_take_it():
    client = setup_market()
    lease = active_lease(client, gpus=16)

    client.post(f"/api/v1/leases/{lease.pk}/terminate/")
    after = client.get(f"/api/v1/leases/{lease.pk}/").json()
    again = active_lease(client, gpus=16)

    assert after["fabric"]["pkey"] is None
    assert Partition.objects.get(holder=lease.reference).released_at is not None
    assert live_pkeys() == {again.reference: 0x1000}


def test_a_lease_moved_to_another_node_keeps_its_pkey_with_the_new_members():
    client = setup_market()
    lease = active_lease(client, gpus=9, topology={"required": "spine"}, allow_moves=True)  # 8+1
    before = Partition.objects.get(holder=lease.reference, released_at__isnull=True)
    lone = (Allocation.objects.filter(lease=lease).values("gpu__node").order_by()
            .annotate(n=Count("id")).order_by("n").first())["gpu__node"]
    left = Node.objects.get(pk=lone)

    # every GPU of the node holding its one GPU fails: it must move to another node
    pool.record_heartbeat(node=left, gpus=[{"index": i, "ecc_errors": 1} for i in range(8)],
                          ib_ports=[], serving=[])
    outcome = remediation.remediate_leases()

    after = Partition.objects.get(holder=lease.reference, released_at__isnull=True)
    now = timezone.now()
    hosts = set(Allocation.objects.filter(lease=lease, period__contains=now)
                .values_list("gpu__node__host_id", flat=True))
    assert outcome == {lease.pk: "moved"}
    assert after.pk == before.pk and after.pkey == before.pkey
    assert left.host_id not in hosts and len(hosts) == 2
    assert set(after.hosts.values_list("pk", flat=True)) == hosts


def test_pkeys_of_the_providers_own_lines_are_never_given():
    client = setup_market()
    Fabric.objects.update(provider_pkeys=[0x1000, 0x1001])

    lease = active_lease(client, gpus=16)

    assert live_pkeys() == {lease.reference: 0x1002}


def test_a_fabric_whose_range_is_spent_fails_the_lease_saying_so():
    client = setup_market()
    Fabric.objects.update(pkey_first=0x2000, pkey_last=0x2000)
    active_lease(client, gpus=16)

    order = {"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 2, "tier": "on_demand",
             "max_price_per_gpu_hour": "3.00", "topology": {"required": "leaf"}}
    body = client.post("/api/v1/orders/", order, format="json").json()
    lease = placing.place_lease(lease_id=body["lease"])

    assert lease.state == "failed"
    assert "no free P_Key between 0x2000 and 0x2000" in lease.events.last().reason


def test_postgresql_refuses_one_pkey_in_two_live_partitions_of_a_fabric():
    setup_market()
    fabric = Fabric.objects.get()
    Partition.objects.create(fabric=fabric, pkey=0x1234, holder="L-1")

    with pytest.raises(IntegrityError), transaction.atomic():
        Partition.objects.create(fabric=fabric, pkey=0x1234, holder="L-2")
    Partition.objects.filter(holder="L-1").update(released_at=timezone.now())
    Partition.objects.create(fabric=fabric, pkey=0x1234, holder="L-2")  # released: free again


@pytest.mark.django_db(transaction=True)
def test_two_placements_racing_for_the_same_free_pkey_get_distinct_ones(monkeypatch):
    setup_market()
    hosts = list(Host.objects.values_list("pk", flat=True))
    barrier = threading.Barrier(2)
    create = Partition.objects.create
    waited, failed = set(), []

    def create_after_both_read(**kwargs):
        # both placements have read the free P_Keys before either inserts: both pick 0x1000
        if threading.get_ident() not in waited:
            waited.add(threading.get_ident())
            barrier.wait(timeout=10)
        return create(**kwargs)

    monkeypatch.setattr(Partition.objects, "create", create_after_both_read)

    def place(holder, members):
        try:
            fabric_services.sync_partitions(hosts_by_holder={holder: members})
        except Exception as exc:  # any failure fails the test below
            failed.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=place, args=("L-1", hosts[:2])),
               threading.Thread(target=place, args=("L-2", hosts[2:4]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failed == []
    assert sorted(live_pkeys().values()) == [0x1000, 0x1001]


# --- the provider's range ------------------------------------------------------------------------


@pytest.fixture
def provider_client():
    setup_market()
    fabric = Fabric.objects.get()
    return client_for(fabric.owner), fabric


@pytest.mark.parametrize("body,field", [
    ({"pkey_range": {"first": "4096", "last": "0x2000"}}, "pkey_range.first"),
    ({"pkey_range": {"first": "0xzz", "last": "0x2000"}}, "pkey_range.first"),
    ({"pkey_range": {"first": "0x0000", "last": "0x2000"}}, "pkey_range.first"),
    ({"pkey_range": {"first": "0x1000", "last": "0x7fff"}}, "pkey_range.last"),
    ({"pkey_range": {"first": "0x3000", "last": "0x2000"}}, "pkey_range.last"),
    ({"pkey_range": {"first": "0x1000"}}, "pkey_range.last"),
    ({"pkey_range": {"first": "0x1000", "last": "0x2000", "size": 3}}, "pkey_range.size"),
    ({}, "pkey_range"),
])
def test_a_malformed_pkey_range_is_refused_naming_the_field_and_nothing_changes(
        provider_client, body, field):
    client, fabric = provider_client

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/", body, format="json")

    assert answer.status_code == 400, answer.content
    assert field in str(answer.json()), answer.json()
    fabric.refresh_from_db()
    assert (fabric.pkey_first, fabric.pkey_last) == (0x1000, 0x7FFE)


def test_a_range_over_the_providers_own_pkeys_is_refused(provider_client):
    client, fabric = provider_client
    Fabric.objects.update(provider_pkeys=[0x2001])

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/",
                          {"pkey_range": {"first": "0x2000", "last": "0x20ff"}}, format="json")

    assert answer.status_code == 400
    assert "pkey_range" in str(answer.json()) and "0x2001" in str(answer.json())


def test_the_provider_sets_the_range_and_the_next_lease_takes_from_it(provider_client):
    client, fabric = provider_client

    answer = client.patch(f"/api/v1/fabrics/{fabric.pk}/",
                          {"pkey_range": {"first": "0x0a00", "last": "0x0aff"}}, format="json")
    tenant = client_for(Organization.objects.get(slug="acme-ai"))
    lease = active_lease(tenant, gpus=16)

    assert answer.status_code == 200, answer.content
    assert answer.json()["partitions"]["pkey_range"] == {"first": "0x0a00", "last": "0x0aff"}
    assert live_pkeys() == {lease.reference: 0x0A00}


def test_a_tenant_cannot_change_a_fabric(provider_client):
    _client, fabric = provider_client
    tenant = Organization.objects.get(slug="acme-ai")

    answer = client_for(tenant).patch(f"/api/v1/fabrics/{fabric.pk}/",
                                      {"pkey_range": {"first": "0x0a00", "last": "0x0aff"}},
                                      format="json")

    assert answer.status_code in (403, 404)


# --- the fabric agent's answer ---------------------------------------------------------------------


def test_the_agents_answer_lists_each_partition_with_its_hcas_ports_and_keeps_its_own_pkeys():
    client = setup_market()
    lease = active_lease(client, gpus=16)
    fabric = Fabric.objects.get()

    answer = fabric_services.record_fabric_report(
        provider=fabric.owner, fabric_name=fabric.name,
        report={"version": 1, "observed_at": timezone.now(), "reachable": False,
                "error": "down", "provider_pkeys": [0x7FFF, 0x0002]})

    (partition,) = answer["partitions"]
    hosts = Partition.objects.get(holder=lease.reference).hosts.all()
    hcas = {hca.guid for host in hosts for hca in host.hcas.all()}
    assert partition["pkey"] == "0x1000" and partition["lease"] == lease.reference
    assert {member["guid"] for member in partition["members"]} == hcas
    assert Fabric.objects.get().provider_pkeys == [0x0002, 0x7FFF]

"""Guarantees checked again when a link goes down: the lease whose route is gone is moved where
its guarantee holds, or, with nowhere to go, degraded with an event naming the link and counted
down for its SLA; a report that changes a link enqueues the re-check.

The fabric: two leaves of two 8-GPU nodes, 400 Gb/s cables, no agent (derived routes)."""

from datetime import timedelta

from django.utils import timezone

from fabric import services as fabric_services
from fabric.api import FabricReportSerializer
from fabric.core.generators import fat_tree
from fabric.models import Fabric, Link
from ibex.outbox.models import OutboxMessage
from market.models import Allocation, LeaseEvent
from pool.models import Binding
from scheduler import guarantees, placing, sla
from tests.fabric.reports import key_of, report
from tests.market.test_guaranteed_admission import order
from tests.scheduler.moves.test_remediation import active_lease, setup_market


def guaranteed_active_lease(client, gbps=25):
    placed = order(client, gbps=gbps)
    placing.place_lease(lease_id=placed.lease_id)
    Binding.objects.update(acknowledged_at=timezone.now())
    placing.activate_acknowledged_leases()
    lease = placed.lease
    lease.refresh_from_db()
    assert lease.state == "active"
    return lease


def hosts_of(lease) -> set[str]:
    return set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
               .values_list("gpu__node__hostname", flat=True))


def take_down_host_cable(host: str) -> Link:
    link = Link.objects.get(ends__hca__host__name=host)
    Link.objects.filter(pk=link.pk).update(state="down")
    return link


def test_a_lease_whose_nodes_cable_goes_down_is_moved_where_its_guarantee_holds(db):
    client = setup_market()
    lease = guaranteed_active_lease(client)
    before = hosts_of(lease)
    take_down_host_cable(sorted(before)[0])

    outcome = guarantees.recheck_guarantees(fabric_id=Fabric.objects.get().pk)

    assert outcome == {lease.pk: "moved"}
    assert hosts_of(lease) != before and sorted(before)[0] not in hosts_of(lease)
    moved = LeaseEvent.objects.get(lease=lease, kind="moved")
    assert "its guaranteed bandwidth no longer holds" in moved.reason
    assert f"{sorted(before)[0]} port 1 → leaf" in moved.reason and "is down" in moved.reason


def test_with_nowhere_to_go_the_lease_is_degraded_naming_the_link_and_counted_down(db):
    client = setup_market()
    lease = guaranteed_active_lease(client)
    active_lease(client, gpus=16, topology={"required": "leaf"})  # the other leaf, standard
    host = sorted(hosts_of(lease))[0]
    take_down_host_cable(host)

    outcome = guarantees.recheck_guarantees(fabric_id=Fabric.objects.get().pk)
    again = guarantees.recheck_guarantees(fabric_id=Fabric.objects.get().pk)

    assert outcome == {lease.pk: "degraded"} and again == {lease.pk: "degraded"}
    broken = LeaseEvent.objects.filter(lease=lease, kind="bandwidth_broken")
    assert broken.count() == 1  # told once
    assert f"{host} port 1 → leaf" in broken.get().reason
    assert "credited under its SLA" in broken.get().reason
    measured = sla.measure(lease, sla.ensure_sla(lease), timezone.now() + timedelta(minutes=10))
    assert measured.down_gpu_seconds >= 16 * 9 * 60


def test_when_the_link_is_back_the_lease_is_restored_and_no_longer_counted_down(db):
    client = setup_market()
    lease = guaranteed_active_lease(client)
    active_lease(client, gpus=16, topology={"required": "leaf"})
    link = take_down_host_cable(sorted(hosts_of(lease))[0])
    guarantees.recheck_guarantees()
    Link.objects.filter(pk=link.pk).update(state="active")

    outcome = guarantees.recheck_guarantees()

    assert outcome == {lease.pk: "restored"}
    assert LeaseEvent.objects.filter(lease=lease, kind="bandwidth_restored").count() == 1


def test_a_standard_lease_is_never_rechecked(db):
    client = setup_market()
    lease = active_lease(client, gpus=16)
    take_down_host_cable(sorted(hosts_of(lease))[0])

    assert guarantees.recheck_guarantees() == {}


def test_a_report_that_takes_a_link_down_enqueues_the_recheck_of_its_fabric(
        db):
    setup_market()
    fabric = Fabric.objects.get()
    spec = fat_tree(4, 4, tiers=2, prefix="hpc-provider-")  # the fabric setup_market built
    body = report(spec, timezone.now(), without={key_of(spec.links[0])})
    form = FabricReportSerializer(data=body)
    assert form.is_valid(), form.errors
    fabric_services.record_fabric_report(provider=fabric.owner, fabric_name=fabric.name,
                                         report=form.validated_data)

    queued = OutboxMessage.objects.filter(task="scheduler.recheck_guarantees")
    assert list(queued.values_list("args", flat=True)) == [[fabric.pk]]

"""A faulty link on a lease's path is an SLA event like a failed GPU: the lease is told once, with
the link named; its GPUs on the hosts the link serves count down until the link is back (then
an event says so); a lease on a host the fabric cut off is moved by remediation. A lease on one
host crosses no cable: its host's links are not its path."""

from datetime import timedelta

import pytest
from django.utils import timezone

from fabric.models import Fabric, Link, LinkFault, Port
from market import leasing
from market.models import Allocation, Lease, LeaseEvent
from notify.models import Event
from pool.models import Binding, Gpu, Node
from scheduler import link_health, placing, sla
from scheduler.models import LeaseLinkNotice
from scheduler.moves import remediation
from tests.fabric.lease_traffic import counters, hca_link, post_report
from tests.factories import client_for
from tests.market.test_guaranteed_admission import rail_optimised_market
from tests.scheduler.moves.test_remediation import active_lease, setup_market

pytestmark = pytest.mark.django_db


def hosts_of(lease) -> list[str]:
    return sorted(set(Allocation.objects.filter(lease=lease, period__contains=timezone.now())
                      .values_list("gpu__node__hostname", flat=True)))


def provider_client():
    return client_for(Fabric.objects.get(name="lab").owner)


def link_events(lease) -> list[tuple[str, str]]:
    return list(LeaseEvent.objects.filter(lease=lease, kind__startswith="link_")
                .order_by("id").values_list("kind", "reason"))


def leaf_of(host: str) -> str:
    return {"hpc-provider-01": "leaf01", "hpc-provider-02": "leaf01"}.get(host, "leaf02")


def test_a_link_down_on_a_leases_path_is_told_once_naming_it_counted_down_and_back():
    tenant = setup_market()
    lease = active_lease(tenant, gpus=16)
    cut, other = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0)
    name = f"{cut} mlx5_0 port 1 - {leaf_of(cut)} port {hca_link(cut).b_port}"

    post_report(agent, t0 + timedelta(seconds=30), without_hosts=[cut])
    first = link_health.watch_links()
    again = link_health.watch_links()
    told = link_events(lease)
    during = tenant.get(f"/api/v1/leases/{lease.pk}/sla/").json()
    post_report(agent, t0 + timedelta(seconds=90))
    back = link_health.watch_links()
    measured = sla.measure(lease, sla.ensure_sla(lease), t0 + timedelta(seconds=150))
    shown = tenant.get(f"/api/v1/leases/{lease.pk}/sla/").json()["measurement"]

    assert first == {"told": 1, "restored": 0} and again == {"told": 0, "restored": 0}
    assert told[0][0] == "link_down" and f"link {name} is down" in told[0][1]
    assert cut in told[0][1] and other not in told[0][1]
    assert Event.objects.get(lease=lease, kind=Event.Kind.DEGRADED).payload["link"] == name
    assert back == {"told": 0, "restored": 1}
    assert link_events(lease)[1][0] == "link_restored"
    assert f"link {name} is back" in link_events(lease)[1][1] and "(down for 60 s)" in \
        link_events(lease)[1][1]
    # its 8 GPUs on the host cut off, for the 60 s the link was down; the other host's none
    assert measured.down_gpu_seconds == 8 * 60
    assert {g.gpu.split("/")[0] for g in measured.gpus} == {cut}
    assert during["measurement"]["faulty_links"] == [{
        "link": name, "kind": "down",
        "started_at": (t0 + timedelta(seconds=30)).isoformat().replace("+00:00", "Z"),
        "ended_at": None}]
    assert shown["faulty_links"][0]["ended_at"] == \
        (t0 + timedelta(seconds=90)).isoformat().replace("+00:00", "Z")


def test_a_link_of_another_host_tells_the_lease_nothing():
    tenant = setup_market()
    lease = active_lease(tenant, gpus=8)
    (host,) = hosts_of(lease)
    elsewhere = next(h for h in ("hpc-provider-03", "hpc-provider-04", "hpc-provider-01")
                     if h != host)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0)

    post_report(agent, t0 + timedelta(seconds=30), without_hosts=[elsewhere])
    told = link_health.watch_links()

    assert LinkFault.objects.filter(kind="down").count() == 1
    assert told == {"told": 0, "restored": 0} and link_events(lease) == []
    assert not LeaseLinkNotice.objects.exists()


def test_a_link_erring_above_the_threshold_is_told_like_one_down():
    tenant = setup_market()
    lease = active_lease(tenant, gpus=16)
    host, _other = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0, xmit={host: 0})

    post_report(agent, t0 + timedelta(seconds=60),
                extra=counters({host: 0}, errors={"rcv_errors": 40}))
    link_health.watch_links()

    (kind, reason), = link_events(lease)
    assert kind == "link_errors"
    assert "errs: 40.0 errors/min > 10" in reason


def test_a_lease_on_a_host_the_fabric_cut_off_is_moved_by_remediation():
    tenant = setup_market()
    lease = active_lease(tenant, gpus=16, topology={"preferred": "leaf"})  # leaf01's two nodes
    cut, kept = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0)

    post_report(agent, t0 + timedelta(seconds=30), without_hosts=[cut])
    link_health.watch_links()
    outcome = remediation.remediate_leases()
    moved_to = hosts_of(lease)

    assert outcome == {lease.pk: "moved"}
    assert cut not in moved_to and kept in moved_to and len(moved_to) == 2
    assert link_events(lease)[0][0] == "link_down"
    assert LeaseEvent.objects.filter(lease=lease, kind="moved").exists()


def test_a_lease_on_one_host_uses_no_cable_so_a_cut_off_host_neither_moves_nor_credits_it():
    tenant = setup_market()
    lease = active_lease(tenant, gpus=8)
    (host,) = hosts_of(lease)
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0)

    post_report(agent, t0 + timedelta(seconds=30), without_hosts=[host])
    told = link_health.watch_links()
    outcome = remediation.remediate_leases()
    measured = sla.measure(lease, sla.ensure_sla(lease), t0 + timedelta(seconds=90))

    assert LinkFault.objects.filter(kind="down").count() == 1
    assert told == {"told": 0, "restored": 0} and link_events(lease) == []
    assert outcome == {} and hosts_of(lease) == [host]
    assert measured.down_gpu_seconds == 0


# --- switch links on the lease's routes ----------------------------------------------------------


def routes_of(down=()) -> dict:
    """A report's routes section for the lab fabric: min-hop tables over the cables not in
    `down` (as OpenSM would program them), from the fabric IBEX holds."""
    from fabric.core.fabric_report import routes_hash, routes_section
    from fabric.core.routes import NO_ROUTE, RouteMap, derived_route_map
    from fabric.models import Switch
    from fabric.selectors import cabling

    fabric = Fabric.objects.get(name="lab")
    seen = cabling(fabric, RouteMap(lids={}, tables={}, peers={}, host_ports={}))
    cut = {port for link in down for port in
           Port.objects.filter(link=link).values_list("device_guid", "number")}
    derived = derived_route_map(
        [(here, there) for here, there in seen.peers.items() if here < there], seen.host_ports,
        set(Switch.objects.filter(fabric=fabric).values_list("guid", flat=True)), down=cut)
    tables = {guid: {lid: port for lid, port in enumerate(table) if port != NO_ROUTE}
              for guid, table in derived.tables.items()}
    section = routes_section(tables, derived.lids)
    return {"routes": section, "routes_hash": routes_hash(section)}


def test_a_switch_link_on_a_leases_routes_is_told_and_closed_once_routed_around():
    from fabric.selectors import route_map

    tenant = setup_market()
    lease = active_lease(tenant, gpus=32, topology={"required": "spine"})  # both leaves
    agent, t0 = provider_client(), timezone.now() + timedelta(seconds=1)
    post_report(agent, t0, body_extra=routes_of())
    route = route_map(Fabric.objects.get(name="lab"))
    hosts = hosts_of(lease)
    ring = route.ring_links(hosts)
    uplink = next(port for port in sorted(ring) if port[0] in route.tables
                  and route.peers[port][0] in route.tables)  # leaf → spine, on the ring
    link = Link.objects.get(ends__device_guid=uplink[0], ends__number=uplink[1])

    post_report(agent, t0 + timedelta(seconds=30), without_links=[link])
    told = link_health.watch_links()
    down_event = link_events(lease)
    post_report(agent, t0 + timedelta(seconds=40), without_links=[link],
                body_extra=routes_of(down=[link]))  # OpenSM routed around it
    rerouted = link_health.watch_links()
    measured = sla.measure(lease, sla.ensure_sla(lease), t0 + timedelta(seconds=100))

    fault = LinkFault.objects.get(link=link)
    assert fault.ended_at is None  # still down
    assert told == {"told": 1, "restored": 0}
    assert down_event[0][0] == "link_down" and f"link {fault.name} is down" in down_event[0][1]
    assert all(host in down_event[0][1] for host in hosts)  # the ring serves them all
    assert rerouted == {"told": 0, "restored": 1}
    assert "is off its routes (rerouted)" in link_events(lease)[1][1]
    # all 32 GPUs counted down from the fault to the poll that brought the new routes
    assert measured.down_gpu_seconds == 32 * 10


# --- hosts with one HCA per rail -----------------------------------------------------------------


def test_on_a_rail_optimised_host_only_a_cable_of_a_rail_the_lease_uses_is_on_its_path():
    client = rail_optimised_market()  # 4 nodes, HCA i of each on rail i's leaf (8 rails)
    body = client.post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00"}, format="json").json()
    lease = Lease.objects.get(pk=body["lease"])
    first, second = sorted(Node.objects.values_list("hostname", flat=True))[:2]
    gpus = [g for node in Node.objects.filter(hostname__in=[first, second])
            for g in Gpu.objects.filter(node=node, index__lt=4)]  # GPUs 0-3: rails 0 to 3
    Allocation.objects.filter(lease=lease).delete()
    leasing.replace_allocations(lease=lease, gpus=[leasing.GpuChoice(g.pk, 0) for g in gpus],
                                gpu_model="H100-80GB", locality={}, price_micros=0,
                                reason="placed by hand", starts_at=lease.starts_at)
    placing.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=timezone.now())
    placing.activate_acknowledged_leases()
    assert hosts_of(lease) == [first, second] and Lease.objects.get(pk=lease.pk).state == "active"

    unused = fault_on(first, "mlx5_6")
    told_unused = link_health.watch_links()
    used = fault_on(first, "mlx5_0")
    told_used = link_health.watch_links()

    assert told_unused == {"told": 0, "restored": 0}
    assert told_used == {"told": 1, "restored": 0}
    assert list(LeaseLinkNotice.objects.values_list("fault_id", "lease_id")) == [
        (used.pk, lease.pk)]
    assert unused.pk != used.pk


def fault_on(host: str, device: str) -> LinkFault:
    """An open `down` fault on the cable of `host`'s HCA `device` (as a report would open)."""
    link = Link.objects.get(ends__hca__description=f"{host} {device}")
    return LinkFault.objects.create(fabric=link.fabric, link=link, kind="down",
                                    name=f"{host} {device} port 1", detail="down",
                                    started_at=timezone.now())

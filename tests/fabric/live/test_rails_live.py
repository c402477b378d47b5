"""Admission on a rail-optimised fabric, for real: 8 hosts in two scalable units, each host's
HCA i cabled to rail i's leaf (4 rails, 100 Gb/s), simulated by ibsim under OpenSM's ftree
routing; the fabric agent reads the switches' tables. Each GPU's traffic leaves by its rail's
HCA (docs/fabric.md, "Rails"), so a lease's guarantee is spread over its hosts' four cables."""

import pytest

from fabric.core.generators import fat_tree
from fabric.models import Fabric
from fabric.selectors import live_partitions, route_map
from market.models import Allocation
from tests.fabric.live.test_admission_live import Market

pytestmark = pytest.mark.django_db(transaction=True)

RAILS = fat_tree(8, 8, rate_gbps=100, rails=4)


@pytest.fixture
def fabric_spec():
    return RAILS


def test_a_guarantee_rides_every_rail_of_its_hosts_and_a_refusal_names_a_rail_cable(
        live_server, simulated_fabric):
    market = Market(live_server, simulated_fabric, spec=RAILS)
    market.agent.poll_once()
    route = route_map(Fabric.objects.get())
    market.offer("node01", "node05")  # one host in each unit: their routes cross a spine

    refused = market.order(gbps="45")  # 2 GPUs a rail × 45 = 90 Gb/s on each rail cable: > 80
    placed = market.order(gbps="35")  # 70 on each rail cable; one HCA would carry 8 × 35 = 280

    rails = [route.name(route.port_of("node01", rail)) for rail in range(4)]
    assert rails == [f"node01 port 1 → su01-rail{rail}" for rail in range(1, 5)]
    assert refused.state == "refused"
    # the first rail's cable is the first overfilled one the check meets
    assert refused.reason == (
        "its guaranteed bandwidth does not fit: node01 port 1 → su01-rail1 would carry 90 Gb/s "
        "of guarantees (0 held + 90 new), above its 80 Gb/s (100 Gb/s × guarantee ratio 0.8)")
    assert placed.state == "filled", placed.reason
    lease = market.active(placed)
    assert Allocation.objects.filter(lease=lease).count() == 16
    # its partition holds every rail's HCA of both hosts: its GPUs use all four rails
    (partition,) = live_partitions(Fabric.objects.get())
    assert partition["lease"] == lease.reference
    assert {member["guid"] for member in partition["members"]} == {
        hca.guid for hca in RAILS.hcas if hca.host in ("node01", "node05")}

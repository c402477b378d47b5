"""A partition's members on hosts with one HCA per rail: only the HCAs of the rails its lease's
GPUs use (GPU i on rail i * HCAs // GPUs, as the node agent gives NCCL_IB_HCA)."""

import pytest

from fabric import selectors
from fabric import services as fabric_services
from fabric.core.partitions import rail_order, rails_used
from fabric.models import Fabric, Hca, Host, Port
from tests.factories import make_org

pytestmark = pytest.mark.django_db


def rail_optimised_hosts(hcas_per_host: int = 4) -> tuple[Fabric, list[Host]]:
    fabric = Fabric.objects.create(owner=make_org("railco", "provider"), name="rails",
                                   kind="rail-optimised", source="generated", summary={})
    hosts = []
    for h in range(2):
        host = Host.objects.create(fabric=fabric, name=f"node{h}", leaf="su0", spine="s0", gpus=8)
        # created out of rail order: the rail is the device's number, not the row's
        for rail in reversed(range(hcas_per_host)):
            guid = f"0x{h:02x}{rail:02x}000000000000"
            hca = Hca.objects.create(fabric=fabric, host=host, guid=guid,
                                     description=f"node{h} mlx5_{rail}")
            Port.objects.create(fabric=fabric, hca=hca, number=1, device_guid=guid)
        hosts.append(host)
    return fabric, hosts


def member_guids(fabric: Fabric) -> set[str]:
    (partition,) = selectors.live_partitions(fabric)
    return {member["guid"] for member in partition["members"]}


def test_a_lease_of_half_of_each_node_has_the_hcas_of_its_rails_only():
    fabric, hosts = rail_optimised_hosts()

    fabric_services.sync_partitions(
        hosts_by_holder={"L-1": [h.pk for h in hosts]},
        gpus_by_holder={"L-1": {h.pk: [0, 1, 2, 3] for h in hosts}})

    # GPUs 0-3 of 8 on 4 rails: rails 0 and 1
    assert member_guids(fabric) == {"0x0000000000000000", "0x0001000000000000",
                                    "0x0100000000000000", "0x0101000000000000"}


def test_a_lease_moved_to_other_gpus_follows_their_rails():
    fabric, hosts = rail_optimised_hosts()
    fabric_services.sync_partitions(hosts_by_holder={"L-1": [h.pk for h in hosts]},
                                    gpus_by_holder={"L-1": {h.pk: [0] for h in hosts}})

    fabric_services.sync_partitions(hosts_by_holder={"L-1": [h.pk for h in hosts]},
                                    gpus_by_holder={"L-1": {h.pk: [7] for h in hosts}})

    assert member_guids(fabric) == {"0x0003000000000000", "0x0103000000000000"}


def test_without_the_gpus_every_hca_of_its_hosts_is_a_member():
    fabric, hosts = rail_optimised_hosts()

    fabric_services.sync_partitions(hosts_by_holder={"L-1": [h.pk for h in hosts]})

    assert len(member_guids(fabric)) == 8


def test_rails_of_gpus():
    assert rails_used([0, 1, 2, 3], hcas=4, gpus_on_host=8) == [0, 1]
    assert rails_used([5], hcas=8, gpus_on_host=8) == [5]
    assert rails_used([0, 1], hcas=1, gpus_on_host=8) is None  # one HCA: all of them
    assert rails_used([], hcas=4, gpus_on_host=8) is None
    assert sorted(["n mlx5_10", "n mlx5_2", "n mlx5_0"],
                  key=lambda d: rail_order(d, "")) == ["n mlx5_0", "n mlx5_2", "n mlx5_10"]

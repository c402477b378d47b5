"""The database, not only the importer, keeps the fabric consistent."""

import pytest
from django.db import IntegrityError, transaction

from fabric.models import Fabric, Hca, Host, Link, Port, Switch


@pytest.fixture
def fabric(provider):
    return Fabric.objects.create(owner=provider, name="f", kind="fat-tree", source="slurm")


@pytest.fixture
def leaf(fabric):
    return Switch.objects.create(fabric=fabric, guid="0x01", name="leaf1", tier="leaf")


@pytest.fixture
def spine(fabric):
    return Switch.objects.create(fabric=fabric, guid="0x02", name="spine1", tier="spine")


def test_a_switch_guid_is_unique_within_a_fabric(fabric, leaf):
    with pytest.raises(IntegrityError), transaction.atomic():
        Switch.objects.create(fabric=fabric, guid="0x01", name="other", tier="leaf")


def test_the_same_guid_may_exist_in_another_fabric(provider, leaf):
    other = Fabric.objects.create(owner=provider, name="g", kind="fat-tree", source="slurm")

    Switch.objects.create(fabric=other, guid="0x01", name="leaf1", tier="leaf")

    assert Switch.objects.filter(guid="0x01").count() == 2


def test_an_hca_guid_is_unique_within_a_fabric(fabric):
    host = Host.objects.create(fabric=fabric, name="gpu01", leaf="l", spine="s")
    Hca.objects.create(fabric=fabric, host=host, guid="0xaa")

    with pytest.raises(IntegrityError), transaction.atomic():
        Hca.objects.create(fabric=fabric, host=host, guid="0xaa")


def port(fabric, switch, number, link=None, end=""):
    return Port.objects.create(fabric=fabric, switch=switch, number=number,
                               device_guid=switch.guid, link=link, link_end=end)


def test_a_link_has_only_one_a_end_so_a_third_port_cannot_join_it(fabric, leaf, spine):
    link = Link.objects.create(fabric=fabric, rate_gbps=400)
    port(fabric, leaf, 1, link, "a")
    port(fabric, spine, 1, link, "b")

    with pytest.raises(IntegrityError), transaction.atomic():
        port(fabric, spine, 2, link, "a")


def test_a_link_cannot_join_a_switch_to_itself(fabric, leaf):
    link = Link.objects.create(fabric=fabric, rate_gbps=400)
    port(fabric, leaf, 1, link, "a")

    with pytest.raises(IntegrityError), transaction.atomic():
        port(fabric, leaf, 2, link, "b")


def test_a_port_number_exists_once_per_device(fabric, leaf):
    port(fabric, leaf, 1)

    with pytest.raises(IntegrityError), transaction.atomic():
        port(fabric, leaf, 1)


def test_a_port_belongs_to_exactly_one_device(fabric):
    with pytest.raises(IntegrityError), transaction.atomic():
        Port.objects.create(fabric=fabric, number=1, device_guid="0x09")

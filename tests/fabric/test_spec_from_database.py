"""`fabric.selectors.load_spec`: a stored fabric as a spec again, with the GUIDs, names, ports
and rates it was saved with, so that an ibsim net file written from the database simulates the
very fabric IBEX holds (`manage.py fabric_sim`)."""

import pytest

from fabric import services
from fabric.core import generators
from fabric.core.netfile import ibsim_netfile
from fabric.models import Fabric, Link
from fabric.selectors import load_spec

GENERATED = {
    "fat-tree": lambda: generators.fat_tree(64, 8, tiers=3, rate_gbps=100),
    "rail-optimised": lambda: generators.fat_tree(16, 8, rails=2),
    "torus": lambda: generators.torus(4, 4, 2),
    "dragonfly": lambda: generators.dragonfly(2, 2, 2),
}


@pytest.mark.parametrize("kind", sorted(GENERATED))
def test_the_spec_read_back_holds_the_same_switches_hcas_and_cables(provider, kind):
    spec = GENERATED[kind]()
    services.save_fabric(owner=provider, name="f", spec=spec, source="generator")

    loaded = load_spec(Fabric.objects.get(name="f"))

    assert loaded.kind == kind
    assert set(loaded.switches) == set(spec.switches)
    assert set(loaded.hcas) == set(spec.hcas)
    assert set(loaded.links) == set(spec.links)
    assert loaded.torus_dims == spec.torus_dims
    assert sorted(ibsim_netfile(loaded).splitlines()) == sorted(ibsim_netfile(spec).splitlines())


def test_a_link_the_agent_saw_at_another_rate_is_read_back_at_that_rate(provider):
    spec = generators.fat_tree(16, 8, rate_gbps=400)
    services.save_fabric(owner=provider, name="f", spec=spec, source="generator")
    Link.objects.filter(pk=Link.objects.order_by("pk").first().pk).update(rate_gbps=100)

    loaded = load_spec(Fabric.objects.get(name="f"))

    assert sorted(link.rate_gbps for link in loaded.links).count(100.0) == 1

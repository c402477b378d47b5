"""Builders for market tests: a verified provider with a small fabric of registered nodes."""

from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts import services as accounts
from pool import services as pool
from pool.models import Gpu
from tests.factories import make_org, report_every_gpu


def provider_with_nodes(slug="hpc-provider", nodes=4, gpu_model="H100-80GB", fabric="lab",
                        rails=1):
    """`rails` > 1: a rail-optimised fat tree, each host's HCA i cabled to rail i's leaf."""
    provider = make_org(slug, "provider")
    accounts.change_provider_state(organization=provider, to_state="verified", actor="test",
                                   reason="audit")
    pool.ensure_gpu_catalogue()
    radix = 4 if nodes <= 8 else 16  # radix 4: 2 hosts per leaf, at most 8 hosts
    if rails > 1:
        radix = max(radix, 2 * rails)
    spec = generators.fat_tree(nodes, radix, tiers=2, rails=rails, prefix=f"{slug}-")
    fabric_services.save_fabric(owner=provider, name=fabric, spec=spec, source="generator")
    pool.register_nodes(provider=provider, specs=[
        pool.NodeSpec(hostname=host, fabric=fabric, gpu_model=gpu_model, gpu_count=8,
                      cpu_cores=64, memory_gib=1024) for host in spec.hosts])
    report_every_gpu(provider)
    return provider


def gpus_of(provider) -> list[Gpu]:
    return list(Gpu.objects.filter(node__provider=provider).order_by("node__hostname", "index"))

"""A small, lively market for the browser tests and the screenshots."""

from datetime import timedelta

from django.utils import timezone

from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts import services as accounts
from market import prices
from market.models import Clearing
from pool import services as pool
from pool.models import Node
from tests.factories import report_every_gpu


def verified_provider(slug: str, *, nodes: int, gpu_model: str, fabric: str, price: int,
                      tiers: int = 2, radix: int = 4):
    provider = accounts.create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                            roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="test",
                                   reason="audit")
    spec = generators.fat_tree(nodes, radix, tiers=tiers, prefix=f"{fabric}-")
    fabric_services.save_fabric(owner=provider, name=fabric, spec=spec, source="generator")
    pool.register_nodes(provider=provider, specs=[
        pool.NodeSpec(hostname=host, fabric=fabric, gpu_model=gpu_model, gpu_count=8,
                      cpu_cores=96, memory_gib=2048) for host in spec.hosts])
    Node.objects.filter(provider=provider).update(state="active")
    report_every_gpu(provider)
    prices.set_prices(provider=provider, scope={"fabric": fabric}, price_micros=price,
                      actor="test")
    return provider


def lively_market():
    """H100s on a 3-tier fabric (several spine blocks), H200s and A100s elsewhere, and an hour
    of H100 clearings."""
    pool.ensure_gpu_catalogue()
    h100 = verified_provider("hpc-provider", nodes=32, gpu_model="H100-80GB", fabric="lab",
                             price=2_450_000, tiers=3, radix=8)
    first = Node.objects.filter(provider=h100).order_by("hostname").first()
    prices.set_prices(provider=h100, scope={"leaf": first.host.leaf}, price_micros=2_190_000,
                      actor="test")
    verified_provider("nordic-compute", nodes=8, gpu_model="H200-141GB", fabric="oslo",
                      price=3_600_000)
    verified_provider("campus-gpus", nodes=4, gpu_model="A100-80GB", fabric="campus",
                      price=1_290_000)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=60)
    for i, cents in enumerate([212, 215, 219, 214, 221, 226, 224, 229, 233, 228, 231, 236]):
        Clearing.objects.create(gpu_model="H100-80GB", interval_start=start + timedelta(
            minutes=5 * i), price_micros=cents * 10_000, gpus_sold=16 + 8 * (i % 4),
            accepted=[{}] * (2 + i % 3), refused=[{}] * (i % 2))
    return h100


def waiting_bids():
    """Spot bids of two tenants resting for the next H100 clearing: the market page's book."""
    from billing import services as money
    from market.orders import OrderRequest, place_order

    for slug, bids in {"deep-labs": [(64, 2_600_000, 6, "spine"), (16, 2_450_000, 2, "leaf")],
                       "tiny-ai": [(8, 2_450_000, 1, None), (8, 2_300_000, 4, "node"),
                                   (32, 2_200_000, 8, "leaf")]}.items():
        tenant = accounts.create_organization(slug=slug, name=slug.replace("-", " ").title(),
                                              roles=("tenant",))
        money.grant_credit(organization=tenant, amount_micros=10_000 * 1_000_000,
                           reason="test", actor="test")
        for gpus, limit, hours, within in bids:
            place_order(tenant=tenant, actor=slug, request=OrderRequest(
                gpu_models=["H100-80GB"], gpus=gpus, hours=hours, tier="spot",
                max_price_micros=limit, fill="rest",
                topology={"required": within} if within else {}))

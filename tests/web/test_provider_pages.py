from django.utils import timezone

from fabric.models import Fabric
from market.models import GpuPrice
from market.orders import OrderRequest, place_order


def test_the_fleet_lists_nodes_with_state_health_and_gpu_counts(provider_web, provider):
    page = provider_web.get("/provider/").content.decode()

    assert page.count('<tr data-node="') == 4
    assert "8 / 0 / 0" in page and "$2.50" in page
    assert "verified" in page


def test_the_fabric_picture_colours_leased_nodes_and_names_the_lease(
        provider_web, provider, tenant):
    order = place_order(tenant=tenant, actor="test", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=8, hours=1, tier="on_demand",
        max_price_micros=3_000_000, topology={"required": "node"}))

    page = provider_web.get("/provider/").content.decode()

    assert page.count('class="node n-full"') == 1 and page.count('class="node n-free"') == 3
    assert f"8/8 GPUs leased · active, reachable — lease {order.lease_id} (acme-ai, 8 GPUs)" in page
    assert page.count('class="spine"') >= 1 and page.count('class="leaf"') == 2


def test_bulk_pricing_a_leaf(provider_web, provider):
    from pool.models import Node

    leaf = Node.objects.filter(provider=provider).select_related("host").first().host.leaf

    response = provider_web.post("/provider/prices/", {
        "scope_kind": "leaf", "scope_value": leaf, "price": "1.75", "min_lease_hours": "1"})

    assert response.status_code == 302
    current = GpuPrice.objects.filter(superseded_at__isnull=True, price_micros=1_750_000)
    assert current.count() == 16
    assert "16 GPUs now cost $1.75 per GPU-hour." in provider_web.get("/provider/").content.decode()


def test_a_scope_matching_nothing_is_refused_next_to_its_field(provider_web, provider):
    response = provider_web.post("/provider/prices/", {
        "scope_kind": "node", "scope_value": "nope", "price": "1.75", "min_lease_hours": "1"})

    assert response.status_code == 400
    assert "No GPU of yours matches this scope." in response.content.decode()
    assert not GpuPrice.objects.filter(price_micros=1_750_000).exists()


def test_a_tenant_is_not_shown_provider_pages(tenant_web):
    assert tenant_web.get("/provider/").status_code == 403


def test_a_fabric_behind_a_slurm_gateway_shows_what_the_gateway_last_said(provider_web, provider):
    page = provider_web.get("/provider/").content.decode()
    assert "data-gateway" not in page  # a fabric of node agents has no gateway
    Fabric.objects.filter(owner=provider).update(
        gateway="slurm", gateway_status="slurm unreachable: Unable to contact slurm controller",
        gateway_seen_at=timezone.now())
    page = provider_web.get("/provider/").content.decode()
    assert "Slurm gateway: slurm unreachable: Unable to contact slurm controller" in page
    assert 'class="alert alert-error" data-gateway' in page

"""The lease page shows the bandwidth its nodes delivered; the provider's fleet page shows its
fabric's links down, errors and utilisation per tier, refreshed by htmx and readable without."""

from datetime import timedelta

from django.utils import timezone

from market.models import Allocation
from tests.fabric.lease_traffic import post_report
from tests.factories import client_for
from tests.scheduler.moves.test_remediation import active_lease

GB = 3_125_000_000  # words: 10 Gb/s over 10 s


def test_the_lease_page_shows_the_gigabits_its_nodes_delivered(tenant_web, tenant, provider):
    lease = active_lease(client_for(tenant), gpus=16)
    hosts = set(Allocation.objects.filter(lease=lease).values_list("gpu__node__hostname",
                                                                   flat=True))
    agent, t0 = client_for(provider), timezone.now() + timedelta(seconds=1)
    unmeasured = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()
    post_report(agent, t0, xmit=dict.fromkeys(hosts, 0))
    post_report(agent, t0 + timedelta(seconds=10), xmit=dict.fromkeys(hosts, 2 * GB))

    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()

    assert "not measured yet" in unmeasured
    assert "<strong>40.0 Gb/s</strong> over the last interval · 40.0 Gb/s on average" in page


def test_the_fleet_page_shows_links_down_and_utilisation_per_tier_and_refreshes_them(
        provider_web, provider, tenant):
    active_lease(client_for(tenant), gpus=8)
    agent, t0 = client_for(provider), timezone.now()
    post_report(agent, t0)
    post_report(agent, t0 + timedelta(seconds=10), without_hosts=["hpc-provider-04"])

    fabric = provider.fabrics.get()

    page = provider_web.get("/provider/").content.decode()
    part = provider_web.get(f"/provider/fabrics/{fabric.pk}/health/",
                            HTTP_HX_REQUEST="true").content.decode()

    assert f'hx-get="/provider/fabrics/{fabric.pk}/health/"' in page
    assert 'data-tier="host-leaf"' in page and 'data-tier="leaf-spine"' in page
    row = part[part.index('data-tier="host-leaf"'):].split("</tr>")[0]
    assert '<td class="num">4</td><td class="num"><strong class="bad">1</strong></td>' in row
    assert "<strong>hpc-provider-04 mlx5_0 port 1 - leaf02 port 2</strong>: down since" in part
    assert part.lstrip().startswith('<div class="fabric-health"')


def test_another_providers_fabric_health_is_not_found(provider_web, provider):
    from fabric import services as fabric_services
    from fabric.core.generators import fat_tree
    from tests.factories import make_org

    rival = make_org("rival-hpc", "provider")
    other = fabric_services.save_fabric(owner=rival, name="rival-fabric",
                                        spec=fat_tree(4, 4, tiers=2), source="generator").fabric

    assert provider_web.get(f"/provider/fabrics/{other.pk}/health/").status_code == 404

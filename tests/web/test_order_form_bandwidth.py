"""The order form's bandwidth class (a select) and guaranteed Gb/s per GPU: placed through the
same service as the API, refused next to the field, and shown on the lease's page."""

from decimal import Decimal

import pytest

from billing.models import Hold
from market.models import Lease, Order
from tests.web.test_dashboard import ORDER


def test_the_form_offers_the_three_classes_standard_first_chosen(tenant_web):
    page = tenant_web.get("/app/").content.decode()

    assert 'name="bandwidth_class"' in page and 'name="gbps_per_gpu"' in page
    assert '<option value="standard" selected>' in page
    assert 'value="guaranteed"' in page and 'value="scavenger"' in page


def test_a_guaranteed_order_is_placed_with_its_rate_and_the_lease_page_shows_it(
        tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**ORDER, "bandwidth_class": "guaranteed",
                                         "gbps_per_gpu": "50"})

    assert response.status_code == 302
    order = Order.objects.get(tenant=tenant)
    assert (order.bandwidth_class, order.gbps_per_gpu) == ("guaranteed", Decimal("50"))
    lease = Lease.objects.get(tenant=tenant)
    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()
    assert ('<span id="bandwidth-class">bandwidth guaranteed, 50 Gb/s per GPU guaranteed'
            '</span>') in page


def test_a_scavenger_order_is_placed_and_shown(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**ORDER, "bandwidth_class": "scavenger"})

    lease = Lease.objects.get(tenant=tenant)
    assert lease.order.bandwidth_class == "scavenger"
    page = tenant_web.get(f"/app/leases/{lease.pk}/").content.decode()
    assert '<span id="bandwidth-class">bandwidth scavenger</span>' in page


@pytest.mark.parametrize(("posted", "field", "says"), [
    ({"bandwidth_class": "guaranteed"}, "gbps_per_gpu", "needs Gb/s per GPU above 0"),
    ({"bandwidth_class": "standard", "gbps_per_gpu": "10"}, "gbps_per_gpu",
     "Only the guaranteed class takes Gb/s per GPU"),
    ({"bandwidth_class": "gold"}, "bandwidth_class", "Select a valid choice"),
    # above the fastest link of any fabric: the service's refusal, at the field
    ({"bandwidth_class": "guaranteed", "gbps_per_gpu": "5000"}, "gbps_per_gpu",
     "above the fastest link"),
])
def test_a_bad_class_or_rate_is_shown_next_to_its_field_and_places_nothing(
        tenant_web, tenant, provider, posted, field, says):
    response = tenant_web.post("/app/", {**ORDER, **posted})

    page = response.content.decode()
    assert response.status_code == 400
    assert f'id="id_{field}_error"' in page and says in page, page[:200]
    assert not Order.objects.exists() and not Hold.objects.exists()

"""Extending a lease commits money as an order does: the extra hours are held, or the
extension is refused like an order the tenant cannot pay for, and nothing changes."""

from datetime import timedelta

from billing import ledger
from billing.models import Account, Hold
from market import orders, prices
from market.models import Allocation, LeaseEvent
from pool.models import Node
from tests.factories import client_for, fund
from tests.market.inventory import provider_with_nodes
from tests.web.conftest import person

H100 = "H100-80GB"


def leased_16_gpus(tenant, dollars: str):
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    fund(tenant, dollars)
    order = orders.place_order(tenant=tenant, actor="test", request=orders.OrderRequest(
        gpu_models=[H100], gpus=16, hours=2, tier="on_demand", max_price_micros=2_500_000))
    assert order.state == "filled"
    return order


def available(tenant) -> int:
    return ledger.balance(tenant, Account.Kind.TENANT_AVAILABLE)


def test_an_extension_the_tenant_cannot_pay_for_is_refused_like_an_order_and_changes_nothing(
        tenant, tenant_client):
    order = leased_16_gpus(tenant, "1000.00")  # holds 16 × 2 h × 2.50 = 80; 920 left
    lease = order.lease
    before = (lease.ends_at, available(tenant), Hold.objects.get().amount_micros,
              sorted(Allocation.objects.filter(lease=lease).values_list("period", flat=True)))

    response = tenant_client.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 8760},
                                  format="json")  # a year: 16 × 8760 × 2.00 = 280,320

    lease.refresh_from_db()
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "insufficient_funds"
    assert (lease.ends_at, available(tenant), Hold.objects.get().amount_micros,
            sorted(Allocation.objects.filter(lease=lease).values_list("period", flat=True))
            ) == before
    assert not LeaseEvent.objects.filter(lease=lease, kind="extended").exists()


def test_an_affordable_extension_holds_each_gpus_price_for_the_extra_hours(tenant, tenant_client):
    order = leased_16_gpus(tenant, "1000.00")
    lease = order.lease
    available_before = available(tenant)

    response = tenant_client.post(f"/api/v1/leases/{lease.pk}/extend/", {"hours": 3},
                                  format="json")

    assert response.status_code == 200
    extra = 16 * 3 * 2_000_000  # the posted price of each GPU it holds
    assert Hold.objects.get().amount_micros == 16 * 2 * 2_500_000 + extra
    assert available(tenant) == available_before - extra
    assert ledger.balance(tenant, Account.Kind.TENANT_HELD) == 16 * 2 * 2_500_000 + extra
    assert response.json()["ends_at"].startswith(
        (order.lease.ends_at + timedelta(hours=3)).isoformat()[:16])


def test_an_extension_over_the_spend_limit_is_refused_as_an_order_would_be(tenant, tenant_client):
    from billing import services as money

    order = leased_16_gpus(tenant, "100000.00")
    money.set_spend_limits(organization=tenant, per_hour_micros=None,
                           per_month_micros=200_000_000)  # 80 held so far

    response = tenant_client.post(f"/api/v1/leases/{order.lease.pk}/extend/", {"hours": 10},
                                  format="json")  # 320 more

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "spend_limit_exceeded"


def test_the_web_page_refuses_an_extension_the_tenant_cannot_pay_for(tenant):
    from django.test import Client

    order = leased_16_gpus(tenant, "1000.00")
    ends = order.lease.ends_at
    web = Client()
    web.force_login(person("acme-owner", tenant))

    response = web.post(f"/app/leases/{order.lease.pk}/extend/", {"hours": "700"}, follow=True)

    order.lease.refresh_from_db()
    assert order.lease.ends_at == ends
    assert "not extended: insufficient funds" in response.content.decode()


def test_a_client_of_the_extension_api_needs_the_trade_scope(tenant):
    order = leased_16_gpus(tenant, "1000.00")
    reader = client_for(tenant, scopes=("read",))

    response = reader.post(f"/api/v1/leases/{order.lease.pk}/extend/", {"hours": 1},
                           format="json")

    assert response.status_code == 403

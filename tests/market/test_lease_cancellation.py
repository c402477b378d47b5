"""An operator cancels a lease with a refund: it ends, its hold comes back, and what the tenant
was charged for it is credited back, once."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing import services
from billing.models import Account, Hold, LedgerTransaction
from market import leasing
from market.models import Allocation, Lease
from market.orders import OrderRequest, place_order
from pool import services as pool
from pool.models import Node
from tests.billing.conftest import balance
from tests.factories import fund, make_org
from tests.market.inventory import provider_with_nodes

Kind = Account.Kind


@pytest.fixture
def provider(db):
    org = provider_with_nodes()
    Node.objects.filter(provider=org).update(state="active")
    from market import prices

    prices.set_prices(provider=org, scope={"fabric": "lab"}, price_micros=2_000_000, actor="test")
    return org


@pytest.fixture
def tenant(db):
    org = make_org("acme-ai", "tenant")
    fund(org, "500.00")
    return org


def leased_and_billed(tenant, provider, minutes: int) -> Lease:
    place_order(tenant=tenant, actor="test", request=OrderRequest(
        gpu_models=["H100-80GB"], gpus=8, hours=2, tier="on_demand",
        max_price_micros=2_500_000, topology={"required": "node"}))
    lease = Lease.objects.get(tenant=tenant)
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=minutes)
    for i in range(minutes):
        services.record_usage(lease_ref=f"L-{lease.pk}:{provider.slug}:2000000", payer=tenant,
                              payee=provider, price_per_gpu_hour_micros=2_000_000, gpus=8,
                              seconds=60, minute=start + timedelta(minutes=i),
                              order_ref=f"order-{lease.order.pk}")
    return lease


def test_a_cancelled_lease_ends_frees_its_gpus_and_refunds_every_charge(tenant, provider):
    pool.ensure_gpu_catalogue()
    lease = leased_and_billed(tenant, provider, minutes=30)  # 8 GPUs × 0.5 h × $2 ≈ $8
    charged = 500_000_000 - balance(tenant, Kind.TENANT_AVAILABLE) - balance(
        tenant, Kind.TENANT_HELD)
    assert charged == 30 * 266_667  # each minute rounded to the micro-dollar

    done = leasing.cancel_lease_with_refund(lease_id=lease.pk, actor="olga-ops",
                                             reason="the tenant's job never started")

    lease.refresh_from_db()
    assert lease.state == "terminated" and done.refunded_micros == charged
    assert lease.events.last().actor == "olga-ops"
    assert not Allocation.objects.filter(lease=lease, period__contains=timezone.now()).exists()
    assert Hold.objects.get(order_ref=f"order-{lease.order.pk}").state == "closed"
    assert balance(tenant, Kind.TENANT_AVAILABLE) == 500_000_000  # back to what it was
    assert balance(tenant, Kind.TENANT_HELD) == 0
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 0
    assert balance(provider, Kind.PROVIDER_HELD_BACK) == 0
    assert balance(None, Kind.PLATFORM_REVENUE) == 0
    refund = LedgerTransaction.objects.get(source_type="lease_refund", source_id=str(lease.pk))
    assert refund.cause == "grant" and "never started" in refund.memo


def test_refunding_a_lease_twice_refunds_it_once(tenant, provider):
    lease = leased_and_billed(tenant, provider, minutes=6)
    leasing.cancel_lease_with_refund(lease_id=lease.pk, actor="olga-ops", reason="dispute")

    again = leasing.cancel_lease_with_refund(lease_id=lease.pk, actor="olga-ops",
                                              reason="dispute")

    assert again.refunded_micros == 0 and "already refunded" in again.detail
    assert LedgerTransaction.objects.filter(source_type="lease_refund").count() == 1
    assert balance(tenant, Kind.TENANT_AVAILABLE) == 500_000_000


def test_a_share_already_paid_out_is_covered_by_the_platform(tenant, provider):
    lease = leased_and_billed(tenant, provider, minutes=30)
    payable = balance(provider, Kind.PROVIDER_PAYABLE)
    from billing import ledger

    ledger.move(from_account=ledger.account(provider, Kind.PROVIDER_PAYABLE),
                to_account=ledger.account(None, Kind.STRIPE_CLEARING), amount_micros=payable,
                cause="payout", source_type="payout", source_id="test", actor="test")

    leasing.cancel_lease_with_refund(lease_id=lease.pk, actor="olga-ops", reason="dispute")

    assert balance(tenant, Kind.TENANT_AVAILABLE) == 500_000_000
    assert balance(None, Kind.SLA_CREDITS) == -payable


def test_a_cancellation_needs_a_reason_and_changes_nothing_without_one(tenant, provider):
    lease = leased_and_billed(tenant, provider, minutes=2)

    with pytest.raises(services.MoneyError) as refused:
        leasing.cancel_lease_with_refund(lease_id=lease.pk, actor="olga-ops", reason=" ")

    assert refused.value.field == "reason"
    lease.refresh_from_db()
    assert lease.state != "terminated"

import pytest
from django.db.models import Sum

from billing import services
from billing.models import Account, Entry, Hold
from tests.billing.conftest import balance, in_threads, racing
from tests.factories import fund

Kind = Account.Kind


def test_placing_an_order_holds_its_maximum_cost(tenant):
    fund(tenant, "100.00")

    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=30_000_000)

    assert hold.state == "open" and hold.remaining_micros == 30_000_000
    assert balance(tenant) == 70_000_000
    assert balance(tenant, Kind.TENANT_HELD) == 30_000_000


def test_an_order_that_would_overdraw_is_refused_and_nothing_is_held(tenant):
    fund(tenant, "10.00")
    entries = Entry.objects.count()

    with pytest.raises(services.MoneyError) as refused:
        services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=10_000_001)

    assert refused.value.code == "insufficient_funds"
    assert "tenant available balance is 10.00 USD, 10.000001 needed" in refused.value.message
    assert Entry.objects.count() == entries and not Hold.objects.exists()
    assert balance(tenant) == 10_000_000


def test_holding_twice_for_one_order_holds_once(tenant):
    fund(tenant, "100.00")
    first = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=5_000_000)
    again = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=5_000_000)
    assert again.pk == first.pk and balance(tenant) == 95_000_000


def test_a_rival_cannot_reuse_an_order_reference(tenant, rival_tenant):
    fund(tenant, "10.00")
    fund(rival_tenant, "10.00")
    services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=1_000_000)
    with pytest.raises(services.MoneyError, match="already holds"):
        services.hold_for_order(tenant=rival_tenant, order_ref="order-1", amount_micros=1_000_000)


def test_releasing_a_hold_returns_what_was_not_captured(tenant, provider):
    fund(tenant, "100.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=30_000_000)
    services.capture(hold=hold, amount_micros=12_000_000, payee=provider, reference="lease-1")

    released = services.release_hold(hold=hold, reason="lease ended")

    assert (released.state, released.captured_micros, released.released_micros) == (
        "closed", 12_000_000, 18_000_000)
    assert balance(tenant) == 88_000_000
    assert balance(tenant, Kind.TENANT_HELD) == 0


def test_releasing_twice_releases_once(tenant):
    fund(tenant, "10.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=4_000_000)
    services.release_hold(hold=hold)
    services.release_hold(hold=hold)
    assert balance(tenant) == 10_000_000


def test_capture_splits_commission_and_hold_back_for_the_provider(tenant, provider):
    fund(tenant, "100.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=30_000_000)

    services.capture(hold=hold, amount_micros=10_000_000, payee=provider, reference="lease-1")

    assert balance(None, Kind.PLATFORM_REVENUE) == 1_000_000  # 10 % commission
    assert balance(provider, Kind.PROVIDER_HELD_BACK) == 450_000  # 5 % of the provider's 9.00
    assert balance(provider, Kind.PROVIDER_PAYABLE) == 8_550_000
    assert balance(tenant, Kind.TENANT_HELD) == 20_000_000


def test_capture_beyond_the_hold_takes_the_rest_from_available(tenant, provider):
    fund(tenant, "10.00")
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=2_000_000)

    services.capture(hold=hold, amount_micros=3_000_000, payee=provider, reference="lease-1")

    assert balance(tenant, Kind.TENANT_HELD) == 0
    assert balance(tenant) == 7_000_000
    assert Hold.objects.get().captured_micros == 2_000_000


def test_the_hourly_spend_limit_refuses_orders_beyond_it(tenant):
    fund(tenant, "1000.00")
    services.set_spend_limits(organization=tenant, per_hour_micros=50_000_000,
                              per_month_micros=None)
    services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=40_000_000)

    with pytest.raises(services.MoneyError) as refused:
        services.hold_for_order(tenant=tenant, order_ref="order-2", amount_micros=10_000_001)

    assert refused.value.code == "spend_limit_exceeded"
    assert "this hour" in refused.value.message
    assert Hold.objects.count() == 1


def test_released_money_no_longer_counts_against_the_limit(tenant):
    fund(tenant, "1000.00")
    services.set_spend_limits(organization=tenant, per_hour_micros=None,
                              per_month_micros=50_000_000)
    hold = services.hold_for_order(tenant=tenant, order_ref="order-1", amount_micros=50_000_000)
    services.release_hold(hold=hold, reason="order cancelled")

    services.hold_for_order(tenant=tenant, order_ref="order-2", amount_micros=50_000_000)

    with pytest.raises(services.MoneyError, match="this month"):
        services.hold_for_order(tenant=tenant, order_ref="order-3", amount_micros=1)


def test_a_rivals_spending_does_not_count_against_the_tenants_limit(tenant, rival_tenant):
    fund(tenant, "100.00")
    fund(rival_tenant, "100.00")
    services.set_spend_limits(organization=tenant, per_hour_micros=10_000_000,
                              per_month_micros=None)
    services.hold_for_order(tenant=rival_tenant, order_ref="r-1", amount_micros=90_000_000)
    services.hold_for_order(tenant=tenant, order_ref="t-1", amount_micros=10_000_000)


@racing
def test_fifty_concurrent_orders_never_overdraw_one_balance(tenant):
    fund(tenant, "100.00")  # room for exactly 33 orders of 3.00

    results = in_threads(50, lambda i: services.hold_for_order(
        tenant=tenant, order_ref=f"order-{i}", amount_micros=3_000_000))

    held = [r for r in results if isinstance(r, Hold)]
    refused = [r for r in results if isinstance(r, services.MoneyError)]
    assert len(held) == 33 and len(refused) == 17
    assert {r.code for r in refused} == {"insufficient_funds"}
    assert balance(tenant) == 1_000_000
    assert balance(tenant, Kind.TENANT_HELD) == 99_000_000
    assert Hold.objects.aggregate(total=Sum("amount_micros"))["total"] == 99_000_000


@racing
def test_concurrent_orders_respect_the_hourly_limit(tenant):
    fund(tenant, "1000.00")
    services.set_spend_limits(organization=tenant, per_hour_micros=20_000_000,
                              per_month_micros=None)

    results = in_threads(20, lambda i: services.hold_for_order(
        tenant=tenant, order_ref=f"order-{i}", amount_micros=3_000_000))

    assert sum(isinstance(r, Hold) for r in results) == 6
    assert balance(tenant, Kind.TENANT_HELD) == 18_000_000

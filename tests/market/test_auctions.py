import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from billing import services as money
from ibex.outbox.models import OutboxMessage
from market import auctions, leasing, orders, prices
from market.models import Clearing, Lease, Order
from pool.models import Node
from tests.factories import client_for, make_org
from tests.market.inventory import gpus_of, provider_with_nodes


def funded_tenant(slug):
    tenant = make_org(slug, "tenant")
    money.grant_credit(organization=tenant, amount_micros=10_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


def market_with_32_gpus_at(price_micros=1_000_000):
    provider = provider_with_nodes(nodes=4)  # 32 H100s on 2 leaves
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=price_micros,
                      actor="test")
    return provider


def bid(tenant, gpus, limit, tier="spot", **extra):
    return orders.place_order(tenant=tenant, actor=tenant.slug, request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=gpus, hours=1, tier=tier, max_price_micros=limit,
        fill="rest", **extra))


@pytest.fixture
def market(db):
    return market_with_32_gpus_at()


def test_bids_clear_in_descending_price_and_pay_the_highest_refused_limit(market):
    high = bid(funded_tenant("high-ai"), 16, 3_000_000)
    middle = bid(funded_tenant("middle-ai"), 16, 2_500_000)
    low = bid(funded_tenant("low-ai"), 8, 2_000_000)

    [cleared] = auctions.clear_markets()

    assert cleared.price_micros == 2_000_000
    assert cleared.gpus_sold == 32
    assert [a["order"] for a in cleared.accepted] == [high.pk, middle.pk]
    assert [r["order"] for r in cleared.refused] == [low.pk]
    for won in (high, middle):
        lease = Order.objects.get(pk=won.pk).lease
        assert lease.price_micros == 2_000_000 and lease.tier == "spot"
    low.refresh_from_db()
    assert low.state == "resting" and low.reason


def test_a_won_lease_is_queued_for_placement_at_once(market):
    from ibex.outbox.models import OutboxMessage

    won = bid(funded_tenant("high-ai"), 8, 3_000_000)

    auctions.clear_markets()

    lease = Order.objects.get(pk=won.pk).lease
    assert OutboxMessage.objects.filter(task="scheduler.place_lease", args=[lease.pk]).count() == 1


def test_without_a_refusal_the_price_is_the_highest_reserve_sold(market):
    gpu = gpus_of(market)[0]
    prices.set_prices(provider=market, scope={"gpu": gpu.pk}, price_micros=1_200_000,
                      actor="test")
    bid(funded_tenant("only-ai"), 32, 3_000_000)

    [cleared] = auctions.clear_markets()

    assert cleared.price_micros == 1_200_000
    assert cleared.gpus_sold == 32


def test_a_market_clears_once_per_interval(market):
    bid(funded_tenant("high-ai"), 8, 3_000_000)
    now = timezone.now()

    first = auctions.clear_markets(now=now)
    bid(funded_tenant("later-ai"), 8, 3_000_000)
    second = auctions.clear_markets(now=now)
    next_interval = auctions.clear_markets(now=now + timedelta(seconds=60))

    assert len(first) == 1
    assert second == []
    assert len(next_interval) == 1
    assert Clearing.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_overlapping_beats_clear_a_market_once():
    market_with_32_gpus_at()
    tenants = [funded_tenant(f"t-{n}") for n in range(4)]
    for n, tenant in enumerate(tenants):
        bid(tenant, 16, 2_000_000 + n * 100_000)
    now = timezone.now()
    barrier = threading.Barrier(2)
    results, failures = [], []

    def beat():
        barrier.wait()
        try:
            results.append(auctions.clear_markets(now=now))
        except Exception as exc:  # any failure fails the test below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert failures == []
    assert Clearing.objects.count() == 1
    assert Order.objects.filter(state="filled").count() == 2
    assert Lease.objects.count() == 2


def test_a_spot_lease_priced_out_gets_a_notice_then_ends(market):
    cheap = bid(funded_tenant("cheap-ai"), 32, 1_500_000)
    auctions.clear_markets(now=timezone.now() - timedelta(minutes=5))
    lease = Order.objects.get(pk=cheap.pk).lease
    leasing.change_lease_state(lease=lease, to_state="placing", actor="t", reason="t")
    leasing.change_lease_state(lease=lease, to_state="active", actor="t", reason="t")
    bid(funded_tenant("rich-ai"), 8, 4_000_000)

    now = timezone.now()
    auctions.clear_markets(now=now)

    lease.refresh_from_db()
    assert lease.state == "preempting"
    assert lease.preempt_at == now + timedelta(seconds=120)
    assert lease.events.filter(to_state="preempting").exists()
    assert auctions.end_preempted_leases(now=now + timedelta(seconds=60)) == []
    assert auctions.end_preempted_leases(now=now + timedelta(seconds=121)) == [lease.pk]
    assert Lease.objects.get(pk=lease.pk).state == "preempted"


def test_a_reserved_order_starts_at_its_window_and_expires_when_it_passes(market,
                                                                          time_machine):
    now = timezone.now()
    time_machine.move_to(now, tick=False)
    soon = now + timedelta(hours=3)
    tenant = funded_tenant("plan-ai")
    reserved = bid(tenant, 8, 3_000_000, tier="reserved", start_earliest=soon,
                   start_latest=soon + timedelta(hours=1))
    late = bid(tenant, 8, 3_000_000, tier="reserved", start_earliest=now + timedelta(minutes=1),
               start_latest=now + timedelta(minutes=2))
    time_machine.move_to(now + timedelta(minutes=5), tick=False)  # its window passed, unfilled

    auctions.clear_markets()

    assert Order.objects.get(pk=reserved.pk).lease.starts_at == soon
    assert Order.objects.get(pk=late.pk).state == "expired"


def test_a_won_spot_lease_is_queued_for_placement_at_once(market):
    won = bid(funded_tenant("quick-ai"), 8, 3_000_000)

    auctions.clear_markets()

    lease = Order.objects.get(pk=won.pk).lease
    assert list(OutboxMessage.objects.filter(task="scheduler.place_lease")
                .values_list("args", flat=True)) == [[lease.pk]]


def test_a_reserved_lease_for_a_later_start_waits_unfailed_and_is_queued_when_it_starts(market):
    from scheduler import placing as scheduler

    soon = timezone.now() + timedelta(minutes=30)
    reserved = bid(funded_tenant("plan-ai"), 8, 3_000_000, tier="reserved", start_earliest=soon,
                   start_latest=soon + timedelta(hours=1))
    auctions.clear_markets()
    lease = Order.objects.get(pk=reserved.pk).lease
    assert not OutboxMessage.objects.filter(task="scheduler.place_lease").exists()

    assert scheduler.fail_stuck_leases(now=soon - timedelta(minutes=1)) == []
    assert scheduler.requeue_unplaced_leases(now=soon - timedelta(minutes=1)) == []
    assert scheduler.requeue_unplaced_leases(now=soon + timedelta(seconds=1)) == [lease.pk]
    assert Lease.objects.get(pk=lease.pk).state == "pending"


def test_the_markets_api_publishes_prices_and_clearings(market, api_client):
    bid(funded_tenant("high-ai"), 16, 3_000_000)
    auctions.clear_markets()

    listing = {m["gpu_model"]: m for m in api_client.get("/api/v1/markets/").json()}
    history = api_client.get("/api/v1/markets/H100-80GB/history/").json()["results"]

    h100 = listing["H100-80GB"]
    assert h100["offered_gpus"] == 32
    assert h100["free_gpus"] == 16  # the winner's 16 are allocated from the clearing on
    assert listing["A100-80GB"] == {"gpu_model": "A100-80GB", "offered_gpus": 0, "free_gpus": 0,
                                    "on_demand_min": None, "on_demand_max": None,
                                    "last_clearing": None}
    assert h100["on_demand_min"] == h100["on_demand_max"] == "1.00"
    assert h100["last_clearing"]["gpus_sold"] == 16
    assert history[0]["price_per_gpu_hour"] == "1.00"
    assert api_client.get("/api/v1/markets/GTX-1080/history/").status_code == 404


def test_the_markets_api_answers_in_a_few_queries_whatever_the_number_of_markets(
        market, api_client, django_assert_max_num_queries):
    bid(funded_tenant("high-ai"), 16, 3_000_000)
    auctions.clear_markets()

    with django_assert_max_num_queries(6):
        listing = api_client.get("/api/v1/markets/").json()

    assert len(listing) >= 6


def test_tenants_order_spot_through_the_api_and_see_it_rest_until_the_clearing(market):
    client = client_for(funded_tenant("api-ai"))

    response = client.post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 1, "tier": "spot",
        "max_price_per_gpu_hour": "2.00", "fill": "rest"}, format="json")
    auctions.clear_markets()

    assert response.json()["state"] == "resting"
    assert response.json()["reason"] == "waiting for the next clearing"
    assert client.get(f"/api/v1/orders/{response.json()['id']}/").json()["state"] == "filled"

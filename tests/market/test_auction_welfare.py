"""The auction service clears with the welfare-maximising winners (market.core.winners): a
refused bid learns its price to win, a bid over alternatives wins at most one shape in any
market, and every clearing keeps its welfare, bound, gap and the book it was solved from."""

import io
import json
from decimal import Decimal

from django.core.management import call_command
from django.utils import timezone

from market import auctions, orders, prices
from market.core import winners
from market.core.book import read_book
from market.core.winners import clear_welfare
from market.models import Lease, Order
from pool.models import Node
from tests.factories import client_for
from tests.market.inventory import provider_with_nodes
from tests.market.test_auctions import bid, funded_tenant, market_with_32_gpus_at
from tests.scheduler.pools.test_pool_guarantees import spread_two_and_two


def hours_bid(tenant, gpus, limit, hours):
    return orders.place_order(tenant=tenant, actor=tenant.slug, request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=gpus, hours=hours, tier="spot", max_price_micros=limit,
        fill="rest"))


def test_more_hours_beat_a_higher_hourly_limit_where_welfare_says_so_and_the_loser_learns_its_price(db):
    market_with_32_gpus_at(1_000_000)  # 32 H100s at $1.00
    short = hours_bid(funded_tenant("short-ai"), 32, 3_000_000, hours=1)  # welfare 64
    long = hours_bid(funded_tenant("long-ai"), 32, 2_000_000, hours=4)  # welfare 128

    [cleared] = auctions.clear_markets()

    assert Order.objects.get(pk=long.pk).state == "filled"
    short.refresh_from_db()
    assert short.state == "resting"
    # 32 GPUs x 1 h x (limit - $1.00) must beat 128: a limit of $5.01
    assert short.price_to_win_micros == 5_010_000
    body = client_for(short.tenant).get(f"/api/v1/orders/{short.pk}/").json()
    assert body["price_to_win"] == "5.01"
    assert cleared.welfare == Decimal(128) and cleared.gap == 0 and cleared.optimal is True


def test_raising_a_limit_to_its_price_to_win_wins_the_same_book_and_a_cent_below_does_not(db):
    market_with_32_gpus_at(1_000_000)
    short = hours_bid(funded_tenant("short-ai"), 32, 3_000_000, hours=1)
    hours_bid(funded_tenant("long-ai"), 32, 2_003_300, hours=4)  # welfare 128.4224: no tie
    [cleared] = auctions.clear_markets()
    short.refresh_from_db()
    assert short.state == "resting" and short.price_to_win_micros == 5_020_000

    def wins_at(limit: str) -> bool:
        book = json.loads(json.dumps(cleared.book))
        for raw in book["bids"]:
            if raw["id"] == str(short.pk):
                raw["max_price_per_gpu_hour"] = limit
        parsed = read_book(book)
        answer = clear_welfare(parsed.levels, parsed.nodes, parsed.bids, price_to_win=False)
        return answer.winner(str(short.pk)) is not None

    assert wins_at("5.02") and not wins_at("5.01")


def test_a_bid_over_alternatives_wins_one_shape_in_whichever_market_welfare_chooses(db):
    market_with_32_gpus_at(1_000_000)  # H100s
    a100 = provider_with_nodes(slug="a100-provider", nodes=2, gpu_model="A100-80GB",
                               fabric="lab2")
    Node.objects.update(state="active")
    prices.set_prices(provider=a100, scope={"fabric": "lab2"}, price_micros=1_000_000,
                      actor="test")
    tenant = funded_tenant("alt-ai")
    either = orders.place_order(tenant=tenant, actor="t", request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=32, hours=2, tier="spot", max_price_micros=2_000_000,
        fill="rest", alternatives=[
            {"gpu_models": ["H100-80GB"], "gpus": 32, "hours": 2, "max_price_micros": 2_000_000,
             "topology": {}},
            {"gpu_models": ["A100-80GB"], "gpus": 16, "hours": 2, "max_price_micros": 2_500_000,
             "topology": {}}]))
    rich = bid(funded_tenant("rich-ai"), 32, 3_000_000)

    cleared = {c.gpu_model: c for c in auctions.clear_markets()}

    either.refresh_from_db()
    assert either.state == "filled" and either.alternative == 1
    assert (either.gpus, either.gpu_models) == (16, ["A100-80GB"])
    assert Lease.objects.filter(order=either).count() == 1
    lease = either.lease
    assert lease.gpu_model == "A100-80GB" and lease.gpu_count == 16
    assert client_for(tenant).get(f"/api/v1/leases/{lease.pk}/").json()["alternative"] == 1
    assert Order.objects.get(pk=rich.pk).state == "filled"
    assert set(cleared) == {"H100-80GB", "A100-80GB"}
    assert [a["alternative"] for a in cleared["A100-80GB"].accepted] == [1]


def test_the_history_shows_each_clearings_welfare_bound_and_gap(db, api_client):
    market_with_32_gpus_at(1_000_000)
    bid(funded_tenant("high-ai"), 16, 3_000_000)
    auctions.clear_markets()

    [row] = api_client.get("/api/v1/markets/H100-80GB/history/").json()["results"]

    assert Decimal(row["welfare"]) == Decimal(32)  # 16 GPUs x 1 h x ($3.00 - $1.00)
    assert Decimal(row["welfare_bound"]) == Decimal(32)
    assert Decimal(row["gap"]) == 0 and row["optimal"] is True


def test_an_exported_book_replays_to_the_same_winners(db, tmp_path):
    market_with_32_gpus_at(1_000_000)
    winner = bid(funded_tenant("high-ai"), 16, 3_000_000)
    bid(funded_tenant("mid-ai"), 24, 2_000_000)
    [cleared] = auctions.clear_markets(now=timezone.now())
    book = tmp_path / "book.json"

    call_command("export_book", str(cleared.pk), "--out", str(book))
    out = io.StringIO()
    call_command("clear_book", str(book), stdout=out)

    [market] = json.loads(out.getvalue())["markets"]
    assert [a["id"] for a in market["accepted"]] == [str(winner.pk)]
    assert market["welfare"] == str(cleared.welfare.normalize()) or \
        Decimal(market["welfare"]) == cleared.welfare
    assert sum(market["accepted"][0]["assignment"].values()) == 16


def test_a_bid_below_every_reserve_is_told_so_and_what_would_win(db):
    market_with_32_gpus_at(1_000_000)
    cheap = bid(funded_tenant("cheap-ai"), 8, 500_000)

    auctions.clear_markets()

    cheap.refresh_from_db()
    assert cheap.reason == ("the limit 0.50 is below the lowest reserve price in the H100-80GB "
                            "market, 1.00 per GPU-hour")
    assert cheap.price_to_win_micros == 1_010_000  # at 1.00 it would add no welfare


def test_a_winner_whose_gpus_an_on_demand_order_took_meanwhile_rests_and_the_clearing_stands(
        db, monkeypatch):
    market_with_32_gpus_at(1_000_000)
    winner = bid(funded_tenant("slow-ai"), 32, 3_000_000)
    solve = winners.clear_welfare

    def solve_while_someone_orders(*args, **kwargs):
        answer = solve(*args, **kwargs)
        orders.place_order(tenant=funded_tenant("fast-ai"), actor="fast", request=orders.OrderRequest(
            gpu_models=["H100-80GB"], gpus=8, hours=1, tier="on_demand",
            max_price_micros=2_000_000))
        return answer

    monkeypatch.setattr(winners, "clear_welfare", solve_while_someone_orders)
    [cleared] = auctions.clear_markets()

    winner.refresh_from_db()
    assert winner.state == "resting" and "another lease took its GPUs" in winner.reason
    assert cleared.accepted == [] and cleared.refused[0]["order"] == winner.pk
    assert Lease.objects.filter(tenant__slug="fast-ai").count() == 1


def test_a_guaranteed_winner_takes_the_leaf_with_the_most_headroom_among_equally_cheap_ones(db):
    market_with_32_gpus_at(1_000_000)  # two leaves of two 8-GPU nodes, 400 Gb/s cables
    held = orders.place_order(
        tenant=funded_tenant("held-ai"), actor="t", request=orders.OrderRequest(
            gpu_models=["H100-80GB"], gpus=4, hours=4, tier="on_demand",
            max_price_micros=3_000_000, bandwidth_class="guaranteed",
            gbps_per_gpu=Decimal(45)))
    spread_two_and_two(held.lease)  # 90 Gb/s held on each of leaf 1's node links
    tight_leaf = Node.objects.order_by("hostname").first().host.leaf
    won = bid(funded_tenant("bw-ai"), 12, 2_000_000, bandwidth_class="guaranteed",
              gbps_per_gpu=Decimal(10), topology={"required": "leaf"})

    [cleared] = auctions.clear_markets()

    # the clearing alone puts it on leaf 1's 6 + 6 free GPUs (welfare is the same on either
    # leaf); leaf 2 (8 + 4) keeps 240 Gb/s free on its tightest link against leaf 1's 170
    book = read_book(cleared.book)
    alone = clear_welfare(book.levels, book.nodes, book.bids, price_to_win=False)
    leaf_of = {node.name: node.labels["leaf"] for node in book.nodes}
    assert {leaf_of[name] for name in alone.winner(str(won.pk)).reserves_micros} == {
        f"lab/{tight_leaf}"}
    won.refresh_from_db()
    assert won.state == "filled"
    leaves = set(won.lease.allocations.values_list("gpu__node__host__leaf", flat=True))
    assert leaves and tight_leaf not in leaves
    assert won.lease.allocations.count() == 12

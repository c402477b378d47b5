import re
from datetime import UTC, datetime, timedelta

from market import orders
from market.models import Clearing
from pool.models import GpuModel

NOW = datetime(2026, 11, 18, 13, 20, tzinfo=UTC)


def table(page: str, table_id: str) -> str:
    return re.search(rf'<table id="{table_id}">.*?</table>', page, re.S).group(0)


def svg(page: str, css_class: str) -> str:
    return re.search(rf'<svg class="chart {css_class}".*?</svg>', page, re.S).group(0)


def test_it_shows_every_gpu_model_with_posted_prices_and_free_gpus(client, provider):
    response = client.get("/")

    assert response.status_code == 200
    page = response.content.decode()
    assert "H100-80GB" in page
    assert "$2.50" in page and "32</strong> of 32 GPUs" in page
    for model in GpuModel.objects.values_list("name", flat=True):
        assert model in page


def test_the_cards_refresh_through_an_htmx_partial(client, provider):
    page = client.get("/").content.decode()
    assert 'hx-get="/markets/cards/"' in page and 'hx-trigger="every 10s"' in page

    partial = client.get("/markets/cards/")

    assert partial.status_code == 200
    body = partial.content.decode()
    assert "<html" not in body and "H100-80GB" in body


def test_the_history_page_lists_clearings_and_draws_their_prices(client, provider,
                                                                 time_machine):
    time_machine.move_to(NOW, tick=False)
    for i, price in enumerate([2_100_000, 2_300_000, 2_200_000]):
        Clearing.objects.create(gpu_model="H100-80GB",
                                interval_start=NOW - timedelta(minutes=10 - i),
                                price_micros=price, gpus_sold=8 * (i + 1))

    response = client.get("/markets/H100-80GB/")

    page = response.content.decode()
    assert response.status_code == 200
    clearings = table(page, "clearings-table")
    assert "$2.30" in clearings
    assert clearings.count("<tr>") == 1 + 3  # the head row and three clearings
    assert '<svg class="chart candles"' in page


def test_the_market_page_draws_hourly_candles_with_their_table_beside(client, provider,
                                                                      time_machine):
    time_machine.move_to(NOW, tick=False)
    for minutes_ago, price in [(200, 2_100_000), (190, 2_600_000), (185, 1_900_000),
                               (120, 2_400_000), (5, 2_200_000)]:
        Clearing.objects.create(gpu_model="H100-80GB", price_micros=price, gpus_sold=8,
                                interval_start=NOW - timedelta(minutes=minutes_ago))

    page = client.get("/markets/H100-80GB/").content.decode()

    chart = svg(page, "candles")
    assert 'role="img"' in chart and "aria-label=" in chart
    assert chart.count('class="wick"') == 3  # hours with prices: 10:00, 11:00, 13:00
    assert "open $2.10, high $2.60, low $1.90, close $1.90" in chart
    candles = table(page, "candles-table")
    assert "<caption>" in candles and '<th scope="col"' in candles
    assert candles.count('<th scope="row">') == 24  # every hour of the day, empty ones too
    assert '<th scope="row">11-18 13:00</th><td class="num">$2.20</td>' in candles


def test_daily_candles_are_a_link_away(client, provider, time_machine):
    time_machine.move_to(NOW, tick=False)

    page = client.get("/markets/H100-80GB/?interval=1d").content.decode()

    assert table(page, "candles-table").count('<th scope="row">') == 30
    assert 'href="?interval=1h"' in page
    assert "/api/v1/markets/H100-80GB/candles/?interval=1d&amp;format=csv" in page


def test_the_market_page_draws_the_books_depth_naming_no_bidder(client, provider, tenant,
                                                                time_machine):
    time_machine.move_to(NOW, tick=False)
    for gpus, limit, within in [(16, 3_000_000, "leaf"), (8, 3_000_000, None),
                                (4, 2_500_000, "node")]:
        orders.place_order(tenant=tenant, actor="tess", request=orders.OrderRequest(
            gpu_models=["H100-80GB"], gpus=gpus, hours=2, tier="spot", max_price_micros=limit,
            fill="rest", topology={"required": within} if within else {}))

    page = client.get("/markets/H100-80GB/").content.decode()

    chart = svg(page, "depth")
    assert chart.count('class="depth-bar"') == 2
    assert "28 GPUs bid at $2.50 or more (4 at $2.50)" in chart
    book = table(page, "book-table")
    assert "<caption>" in book
    assert ('<th scope="row">$3.00</th><td class="num">2</td><td class="num">24</td>'
            '<td class="num">48</td><td class="num">24</td><td>none 8 · leaf 16</td>') in book
    assert "acme" not in page.lower() and "tess" not in page


def test_an_empty_market_says_so_instead_of_drawing(client, provider, time_machine):
    time_machine.move_to(NOW, tick=False)

    page = client.get("/markets/H100-80GB/").content.decode()

    assert "No clearing had a price in this range." in page
    assert "No bids wait for the next clearing." in page


def test_an_unknown_market_is_a_404(client, db):
    assert client.get("/markets/Z9000/").status_code == 404


def test_the_api_and_admin_keep_their_paths(client, db):
    assert client.get("/api/v1/markets/").status_code == 200
    assert client.get("/admin/login/").status_code == 200

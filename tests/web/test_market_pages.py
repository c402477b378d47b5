from market.models import Clearing
from pool.models import GpuModel


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


def test_the_history_page_lists_clearings_and_draws_their_prices(client, provider):
    from datetime import timedelta

    from django.utils import timezone

    start = timezone.now().replace(microsecond=0)
    for i, price in enumerate([2_100_000, 2_300_000, 2_200_000]):
        Clearing.objects.create(gpu_model="H100-80GB", interval_start=start + timedelta(minutes=i),
                                price_micros=price, gpus_sold=8 * (i + 1))

    response = client.get("/markets/H100-80GB/")

    page = response.content.decode()
    assert response.status_code == 200
    assert "$2.30" in page and "<polyline" in page
    assert page.count("<tr>") == 1 + 3  # the head row and three clearings


def test_an_unknown_market_is_a_404(client, db):
    assert client.get("/markets/Z9000/").status_code == 404


def test_the_api_and_admin_keep_their_paths(client, db):
    assert client.get("/api/v1/markets/").status_code == 200
    assert client.get("/admin/login/").status_code == 200

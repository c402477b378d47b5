"""The order form's bid over alternatives: 2 to 8 rows, each a shape with its own limit,
placed through the same service as the API; the orders list shows the shapes, the winner and
a refused bid's price to win."""

from billing.models import Hold
from market.models import Order
from tests.web.test_dashboard import ORDER

BID = {**ORDER, "tier": "spot", "fill": "rest", "idempotency_key": "alt-1"}


def row(n: int, gpus="8", models="H100-80GB", within="", hours="2", limit="3.00") -> dict:
    return {f"alt-{n}-gpus": gpus, f"alt-{n}-gpu_models": models, f"alt-{n}-within": within,
            f"alt-{n}-hours": hours, f"alt-{n}-max_price": limit}


def test_a_bid_over_two_rows_rests_with_both_shapes_and_holds_the_dearest(
        tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**BID, **row(0, within="required:leaf"),
                                         **row(3, gpus="16", limit="2.80")})

    assert response.status_code == 302
    order = Order.objects.get(tenant=tenant)
    assert order.state == "resting" and order.alternative is None
    assert order.alternatives == [
        {"gpu_models": ["H100-80GB"], "gpus": 8, "hours": 2, "max_price_micros": 3_000_000,
         "topology": {"required": "leaf"}},
        {"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 2, "max_price_micros": 2_800_000,
         "topology": {}}]  # rows 1, 2 and 4-7 were left empty
    assert Hold.objects.get(order_ref=f"order-{order.pk}").amount_micros == 16 * 2 * 2_800_000
    page = tenant_web.get("/app/").content.decode()
    assert f"Order {order.pk} resting" in page and "over 2 alternatives" in page


def test_several_models_in_a_row_are_separated_by_a_bar(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**BID, **row(0, models="H100-80GB | H100-80GB"), **row(1)})

    assert Order.objects.get(tenant=tenant).alternatives[0]["gpu_models"] == [
        "H100-80GB", "H100-80GB"]


def test_a_bad_row_is_shown_in_that_row_and_places_nothing(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**BID, **row(0), **row(1, gpus="", limit="abc")})

    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_alt-1-gpus_error"' in page and 'id="id_alt-1-max_price_error"' in page
    assert "Give this, or leave the whole row empty." in page
    assert "An alternative has an error: see its row." in page
    assert "<details id=\"alternatives\" open>" in page
    assert not Order.objects.exists() and not Hold.objects.exists()


def test_a_row_naming_no_market_is_refused_by_the_service_next_to_its_models(
        tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**BID, **row(0), **row(2, models="Z9000")})

    page = response.content.decode()
    assert response.status_code == 400
    assert 'id="id_alt-2-gpu_models_error"' in page  # the second filled row is row 2
    assert "no market for GPU model &#x27;Z9000&#x27;" in page
    assert not Order.objects.exists()


def test_one_row_is_not_a_bid_over_alternatives(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**BID, **row(0)})

    assert response.status_code == 400
    assert 'id="alternatives-error"' in response.content.decode()
    assert "Give 2 to 8 alternatives (1 given)." in response.content.decode()
    assert not Order.objects.exists()


def test_alternatives_on_demand_are_refused_next_to_the_tier(tenant_web, tenant, provider):
    response = tenant_web.post("/app/", {**BID, "tier": "on_demand", **row(0), **row(1)})

    assert response.status_code == 400
    assert 'id="id_tier_error"' in response.content.decode()
    assert not Order.objects.exists()


def test_without_rows_the_one_shape_still_needs_its_gpus_hours_and_limit(tenant_web, tenant,
                                                                         provider):
    response = tenant_web.post("/app/", {**ORDER, "gpus": "", "hours": "", "max_price": ""})

    page = response.content.decode()
    assert response.status_code == 400
    assert all(f'id="id_{name}_error"' in page for name in ("gpus", "hours", "max_price"))
    assert not Order.objects.exists()


def test_the_orders_list_shows_the_shapes_and_a_refused_bids_price_to_win(
        tenant_web, tenant, provider):
    tenant_web.post("/app/", {**BID, **row(0, within="preferred:node"), **row(1, gpus="16")})
    order = Order.objects.get(tenant=tenant)
    Order.objects.filter(pk=order.pk).update(
        state="refused", reason="outbid at the clearing", price_to_win_micros=2_415_000)

    page = tenant_web.get("/app/activity/").content.decode()

    assert "8 × H100-80GB · 2 h · limit $3.00 · node preferred" in page
    assert "16 × H100-80GB · 2 h · limit $3.00</li>" in page
    assert "Price to win: <strong>$2.415</strong> per GPU-hour" in page


def test_a_bid_no_limit_would_have_won_says_why(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**BID, **row(0), **row(1, gpus="16")})
    Order.objects.filter(tenant=tenant).update(
        state="refused", price_to_win_reason="no leaf has 16 free H100-80GB")

    page = tenant_web.get("/app/activity/").content.decode()

    assert "No limit would have won: no leaf has 16 free H100-80GB" in page


def test_the_alternative_that_won_is_marked(tenant_web, tenant, provider):
    tenant_web.post("/app/", {**BID, **row(0), **row(1, gpus="16")})
    Order.objects.filter(tenant=tenant).update(state="filled", alternative=1,
                                               price_to_win_micros=None)

    page = tenant_web.get("/app/activity/").content.decode()

    assert '<li class="won">16 × H100-80GB · 2 h · limit $3.00 · <strong>won</strong></li>' in page
    assert "bid over 2 alternatives: alternative 2 won" in page
    assert "Price to win" not in page


def test_the_lease_page_says_which_alternative_of_its_order_won(tenant_web, tenant, provider):
    tenant_web.post("/app/", ORDER)  # an on-demand order fills at once: a lease to hang it on
    order = Order.objects.get(tenant=tenant)
    Order.objects.filter(pk=order.pk).update(alternatives=[{}, {}, {}], alternative=2)

    page = tenant_web.get(f"/app/leases/{order.lease_id}/").content.decode()

    assert f"alternative 3 of 3 of order #{order.pk} won" in page


def test_the_lease_page_of_a_one_shape_order_names_no_alternative(tenant_web, tenant,
                                                                  provider):
    tenant_web.post("/app/", ORDER)
    order = Order.objects.get(tenant=tenant)

    page = tenant_web.get(f"/app/leases/{order.lease_id}/").content.decode()

    assert 'id="won-alternative"' not in page

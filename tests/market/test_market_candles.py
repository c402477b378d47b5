"""`GET /api/v1/markets/{model}/candles/`: open, high, low, close of clearing prices and what
sold, per hour or day, empty intervals included."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from billing import services as money
from billing.core.money import to_micros
from market import auctions, orders, prices
from market.models import Clearing
from pool.models import Node
from tests.factories import make_org
from tests.market.inventory import provider_with_nodes

NOW = datetime(2026, 11, 18, 14, 20, tzinfo=UTC)
TODAY = datetime(2026, 11, 18, tzinfo=UTC)
URL = "/api/v1/markets/H100-80GB/candles/"


def clearing(at, dollars=None, *, gpus_sold=0, model="H100-80GB"):
    """A recorded clearing of the market at `at`, its price in dollars (None: no price)."""
    return Clearing.objects.create(
        gpu_model=model, interval_start=at, gpus_sold=gpus_sold,
        price_micros=None if dollars is None else to_micros(dollars))


@pytest.fixture
def market(db, time_machine):
    time_machine.move_to(NOW, tick=False)
    return provider_with_nodes(nodes=4)


def test_a_day_of_hours_by_default_with_its_empty_hours(api_client, market):
    clearing(TODAY + timedelta(hours=9, minutes=5), "2.10", gpus_sold=8)
    clearing(TODAY + timedelta(hours=14, minutes=1), "2.40", gpus_sold=16)

    body = api_client.get(URL).json()

    assert body["interval"] == "1h"
    assert body["from"] == "2026-11-17T15:00:00Z" and body["to"] == "2026-11-18T15:00:00Z"
    candles = body["candles"]
    assert len(candles) == 24
    assert [c["interval_start"] for c in candles[:2]] == ["2026-11-17T15:00:00Z",
                                                          "2026-11-17T16:00:00Z"]
    assert candles[-1]["interval_start"] == "2026-11-18T14:00:00Z"  # the hour running now
    priced = {c["interval_start"]: c["close"] for c in candles if c["clearings"]}
    assert priced == {"2026-11-18T09:00:00Z": "2.10", "2026-11-18T14:00:00Z": "2.40"}
    empty = candles[0]
    assert empty == {"interval_start": "2026-11-17T15:00:00Z",
                     "interval_end": "2026-11-17T16:00:00Z", "open": None, "high": None,
                     "low": None, "close": None, "clearings": 0, "gpus_sold": 0,
                     "gpu_hours_sold": 0}


def test_open_high_low_close_follow_the_clearings_in_time_order(api_client, market):
    nine = TODAY + timedelta(hours=9)
    # recorded out of time order, with a clearing that sold nothing and had no price
    for minute, dollars in [(30, "2.05"), (0, "2.20"), (45, None), (15, "2.50"), (40, "1.90")]:
        clearing(nine + timedelta(minutes=minute), dollars, gpus_sold=0 if dollars is None else 4)
    clearing(nine + timedelta(hours=1), "9.99")  # the next hour's

    candles = api_client.get(URL, {"from": "2026-11-18T09:00:00Z",
                                   "to": "2026-11-18T10:00:00Z"}).json()["candles"]

    assert candles == [{"interval_start": "2026-11-18T09:00:00Z",
                        "interval_end": "2026-11-18T10:00:00Z", "open": "2.20", "high": "2.50",
                        "low": "1.90", "close": "1.90", "clearings": 5, "gpus_sold": 16,
                        "gpu_hours_sold": 0}]


def test_gpu_hours_sold_are_each_won_bids_gpus_times_its_hours(api_client, market):
    Node.objects.update(state="active")
    prices.set_prices(provider=market, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="test")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=10_000 * 1_000_000, reason="test",
                       actor="test")
    for gpus, hours in [(16, 3), (8, 2)]:
        orders.place_order(tenant=tenant, actor="acme", request=orders.OrderRequest(
            gpu_models=["H100-80GB"], gpus=gpus, hours=hours, tier="spot",
            max_price_micros=2_000_000, fill="rest"))

    [cleared] = auctions.clear_markets(now=NOW)
    candles = api_client.get(URL).json()["candles"]

    assert cleared.gpus_sold == 24
    assert candles[-1]["gpus_sold"] == 24
    assert candles[-1]["gpu_hours_sold"] == 16 * 3 + 8 * 2
    assert candles[-1]["close"] == "1.00"


def test_daily_candles_over_a_range_start_at_midnight_utc(api_client, market):
    clearing(TODAY - timedelta(days=2) + timedelta(hours=23, minutes=59), "3.00", gpus_sold=2)
    clearing(TODAY - timedelta(days=1) + timedelta(hours=0, minutes=1), "2.00", gpus_sold=3)
    clearing(TODAY + timedelta(hours=1), "2.50", gpus_sold=5)

    body = api_client.get(URL, {"interval": "1d", "from": "2026-11-15T12:00:00Z",
                                "to": "2026-11-18"}).json()

    assert body["from"] == "2026-11-15T00:00:00Z" and body["to"] == "2026-11-18T00:00:00Z"
    assert [(c["interval_start"][:10], c["close"], c["gpus_sold"]) for c in body["candles"]] == [
        ("2026-11-15", None, 0), ("2026-11-16", "3.00", 2), ("2026-11-17", "2.00", 3)]


def test_thirty_days_by_default_for_daily_candles(api_client, market):
    candles = api_client.get(URL, {"interval": "1d"}).json()["candles"]

    assert len(candles) == 30
    assert candles[-1]["interval_start"] == "2026-11-18T00:00:00Z"


def test_another_market_s_clearings_are_not_counted(api_client, market):
    clearing(TODAY + timedelta(hours=14), "5.00", gpus_sold=8, model="A100-80GB")

    candles = api_client.get(URL).json()["candles"]

    assert all(c["clearings"] == 0 for c in candles)


def test_the_candles_as_csv_have_a_header_row_of_the_same_fields(api_client, market):
    clearing(TODAY + timedelta(hours=13, minutes=10), "2.10", gpus_sold=8)

    response = api_client.get(URL, {"from": "2026-11-18T12:00:00Z", "to": "2026-11-18T14:00:00Z",
                                    "format": "csv"})

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [
        ["interval_start", "interval_end", "open", "high", "low", "close", "clearings",
         "gpus_sold", "gpu_hours_sold"],
        ["2026-11-18T12:00:00Z", "2026-11-18T13:00:00Z", "", "", "", "", "0", "0", "0"],
        ["2026-11-18T13:00:00Z", "2026-11-18T14:00:00Z", "2.10", "2.10", "2.10", "2.10", "1",
         "8", "0"],
    ]


@pytest.mark.parametrize(("params", "field"), [
    ({"interval": "5m"}, "interval"),
    ({"from": "2026-11-18T10:00:00Z", "to": "2026-11-18T09:00:00Z"}, "from"),
    ({"from": "2026-11-19T00:00:00Z"}, "from"),  # after the default `to`, now
    ({"from": "yesterday"}, "from"),
    ({"to": "2026-13-01"}, "to"),
    ({"from": "2026-01-01T00:00:00Z"}, "from"),  # more than 1000 hours
    ({"format": "xml"}, "format"),
])
def test_bad_parameters_are_a_400_naming_the_field(api_client, market, params, field):
    response = api_client.get(URL, params)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_a_plus_sign_left_as_a_space_is_read_as_an_offset(api_client, market):
    response = api_client.get(URL + "?from=2026-11-18T09:00:00 00:00&to=2026-11-18T10:00:00Z")

    assert response.status_code == 200
    assert response.json()["from"] == "2026-11-18T09:00:00Z"


def test_an_unknown_market_is_a_404(api_client, market):
    assert api_client.get("/api/v1/markets/Z9000/candles/").status_code == 404


def test_candles_take_the_same_queries_for_many_clearings(api_client, market):
    clearing(TODAY + timedelta(hours=1), "2.00", gpus_sold=1)
    with CaptureQueriesContext(connection) as few:
        api_client.get(URL)
    for minute in range(0, 600, 7):
        clearing(TODAY + timedelta(hours=2, minutes=minute), f"2.{minute:03d}", gpus_sold=1)
    with CaptureQueriesContext(connection) as many:
        candles = api_client.get(URL).json()["candles"]

    assert sum(c["clearings"] for c in candles) == 87
    assert len(many) == len(few) <= 3

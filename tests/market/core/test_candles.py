"""The candles' ranges and intervals, over plain data."""

from datetime import UTC, datetime, timedelta

import pytest

from market.core.candles import (
    MAX_CANDLES,
    Candle,
    MarketDataError,
    candle_range,
    check_format,
    fill_candles,
    sorted_book,
)

NOW = datetime(2026, 11, 18, 14, 20, 31, tzinfo=UTC)


def test_without_from_or_to_it_is_the_last_24_hours_up_to_the_hour_running_now():
    rng = candle_range(interval=None, start=None, end=None, now=NOW)

    assert (rng.interval, rng.count) == ("1h", 24)
    assert rng.start == datetime(2026, 11, 17, 15, tzinfo=UTC)
    assert rng.end == datetime(2026, 11, 18, 15, tzinfo=UTC)


def test_from_moves_back_and_to_moves_on_to_their_intervals_bounds():
    rng = candle_range(interval="1d", start="2026-11-01T13:00:00+02:00",
                       end="2026-11-03T00:00:01Z", now=NOW)

    assert rng.start == datetime(2026, 11, 1, tzinfo=UTC)
    assert rng.end == datetime(2026, 11, 4, tzinfo=UTC)
    assert rng.starts() == [datetime(2026, 11, d, tzinfo=UTC) for d in (1, 2, 3)]


def test_a_date_without_a_zone_is_utc_and_to_alone_counts_back_the_default():
    rng = candle_range(interval="1d", start=None, end="2026-11-10", now=NOW)

    assert rng.end == datetime(2026, 11, 10, tzinfo=UTC)
    assert rng.start == rng.end - timedelta(days=30)


def test_the_number_of_intervals_is_capped():
    last = NOW - timedelta(hours=MAX_CANDLES - 1)  # the hour running now is the last
    assert candle_range(interval="1h", start=f"{last:%Y-%m-%dT%H}:00:00Z", end=None,
                        now=NOW).count == MAX_CANDLES

    with pytest.raises(MarketDataError) as refused:
        candle_range(interval="1h", start=f"{last - timedelta(hours=1):%Y-%m-%dT%H}:00:00Z",
                     end=None, now=NOW)
    assert refused.value.param == "from"


@pytest.mark.parametrize(("interval", "start", "end", "param"), [
    ("1w", None, None, "interval"),
    ("1h", "2026-11-18T10:00Z", "2026-11-18T10:00Z", "from"),
    ("1h", "soon", None, "from"),
    ("1h", None, "2026-11-31", "to"),
    ("1h", None, "0001-01-01", "to"),  # no day before it to start from
    ("1h", "9999-12-31T23:30:00", None, "from"),
    ("1h", "0001-01-01T00:00:00+01:00", "0001-01-02", "from"),
])
def test_bad_parameters_name_themselves(interval, start, end, param):
    with pytest.raises(MarketDataError) as refused:
        candle_range(interval=interval, start=start, end=end, now=NOW)

    assert refused.value.param == param


def test_formats_are_json_and_csv():
    assert check_format(None) == "json" and check_format("CSV") == "csv"
    with pytest.raises(MarketDataError):
        check_format("xlsx")


def test_empty_intervals_are_filled_between_the_found_ones():
    rng = candle_range(interval="1h", start="2026-11-18T10:00Z", end="2026-11-18T13:00Z",
                       now=NOW)
    eleven = datetime(2026, 11, 18, 11, tzinfo=UTC)
    found = {eleven: Candle(start=eleven, end=eleven, open=1, high=2, low=1, close=2,
                            clearings=2, gpus_sold=8, gpu_hours_sold=16)}

    candles = fill_candles(rng, found)

    assert [(c.start.hour, c.end.hour, c.close, c.clearings) for c in candles] == [
        (10, 11, None, 0), (11, 12, 2, 2), (12, 13, None, 0)]


def test_a_book_reads_from_the_highest_price_and_the_narrowest_need_within_one():
    rows = [{"price_micros": 1, "topology": "none"}, {"price_micros": 2, "topology": "spine"},
            {"price_micros": 2, "topology": "none"}, {"price_micros": 2, "topology": "leaf"}]

    assert [(r["price_micros"], r["topology"]) for r in sorted_book(rows)] == [
        (2, "none"), (2, "leaf"), (2, "spine"), (1, "none")]

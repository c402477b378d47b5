from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from billing.core.money import BadAmount, divide_rounded, stripe_minor_units, to_dollars, to_micros


def test_dollars_become_integer_micro_dollars():
    assert to_micros("123.45") == 123_450_000
    assert to_micros("0.000001") == 1
    assert to_micros(7) == 7_000_000


def test_half_a_micro_dollar_rounds_to_even():
    assert to_micros("0.0000005") == 0
    assert to_micros("0.0000015") == 2
    assert to_micros("0.0000025") == 2


def test_floats_and_words_are_refused():
    for bad in (1.5, "abc", "NaN", "Infinity", ""):
        with pytest.raises(BadAmount):
            to_micros(bad)


def test_the_api_prints_two_decimals_when_exact_and_more_when_needed():
    assert to_dollars(5_000_000) == "5.00"
    assert to_dollars(123_450_000) == "123.45"
    assert to_dollars(12_345_000) == "12.345"
    assert to_dollars(1) == "0.000001"
    assert to_dollars(-2_500_000) == "-2.50"
    assert to_dollars(0) == "0.00"


def test_splitting_rounds_half_to_even():
    assert divide_rounded(5, 2) == 2
    assert divide_rounded(7, 2) == 4
    assert divide_rounded(-5, 2) == -2
    assert stripe_minor_units(100_005_000) == 10000  # 10000.5 cents → even


@given(st.integers(min_value=-10**15, max_value=10**15))
def test_printing_and_parsing_round_trip(micros):
    assert to_micros(to_dollars(micros)) == micros
    assert Decimal(to_dollars(micros)) * 1_000_000 == micros

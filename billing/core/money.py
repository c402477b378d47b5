"""Dollars in and out: the one place that parses and prints money.

Inside IBEX money is an integer number of micro-dollars (1 USD = 1_000_000). Dollars typed by
people or programs are parsed with `Decimal` and rounded ROUND_HALF_EVEN to the micro-dollar;
the API prints decimal strings with two decimals when exact, more (up to six) when not.
Floats are refused: they cannot say 0.10 exactly.
"""

import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

MICROS_PER_DOLLAR = 1_000_000
ROUNDING = ROUND_HALF_EVEN
MAX_DOLLARS = 10**12  # micro-dollars stay well inside a 64-bit integer
_MICRO = Decimal("0.000001")


class BadAmount(ValueError):
    pass


def to_micros(dollars: str | int | Decimal) -> int:
    """"12.345" → 12_345_000; half a micro-dollar rounds to even."""
    if isinstance(dollars, float | bool):
        raise BadAmount("amounts are decimal strings, not floats")
    try:
        value = Decimal(str(dollars).strip())
    except InvalidOperation:
        raise BadAmount(f"not an amount: {dollars!r}") from None
    if not value.is_finite():
        raise BadAmount(f"not an amount: {dollars!r}")
    if abs(value) >= MAX_DOLLARS:
        raise BadAmount(f"amounts are under {MAX_DOLLARS:,} dollars")
    return int(value.quantize(_MICRO, rounding=ROUNDING) * MICROS_PER_DOLLAR)


# What people and programs may write (the API schema's pattern for amounts): plain decimals,
# at most six places (a micro-dollar), no exponent, no grouping.
DOLLARS_PATTERN = r"^-?\d+(\.\d{1,6})?$"
_DOLLARS = re.compile(DOLLARS_PATTERN)


def parse_dollars(text: str | int) -> int:
    """An amount typed by a person or sent by a program → micro-dollars, or BadAmount saying
    exactly what is wrong. Nothing is rounded away: "2.5000001" is refused, not cut."""
    if isinstance(text, bool) or not isinstance(text, str | int):
        raise BadAmount('Write amounts as decimal strings, like "100.00".')
    text = str(text).strip()
    if not _DOLLARS.match(text):
        if re.fullmatch(r"-?\d+\.\d{7,}", text):
            raise BadAmount(f"{text!r} has more than 6 decimals: amounts go to the "
                            f"micro-dollar (0.000001).")
        raise BadAmount(f"{text!r} is not a plain decimal amount: write digits with an "
                        f'optional point, like "2.50" (no exponent, sign or separators).')
    if abs(Decimal(text)) >= MAX_DOLLARS:
        raise BadAmount(f"amounts are under {MAX_DOLLARS:,} dollars")
    return to_micros(text)


def to_dollars(micros: int) -> str:
    """12_345_000 → "12.345"; 5_000_000 → "5.00"; -1 → "-0.000001"."""
    value = Decimal(micros) / MICROS_PER_DOLLAR
    text = f"{value.quantize(_MICRO):f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def divide_rounded(numerator: int, denominator: int) -> int:
    """Integer division rounded half to even: the one rule for splitting micro-dollars."""
    return int((Decimal(numerator) / Decimal(denominator)).quantize(Decimal(1),
                                                                  rounding=ROUNDING))


def stripe_minor_units(micros: int) -> int:
    """Stripe counts cents: micro-dollars → cents, rounded half to even."""
    return divide_rounded(micros, 10_000)

"""Output for people: money with its currency, relative times, tables fitted to the terminal,
colour only on a terminal, a spinner only on a terminal."""

import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from ibex_client import output

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(("amount", "per", "text"), [
    (Decimal("2.5"), "", "2.50 USD"),
    (Decimal("2.000000"), "GPU-h", "2.00 USD/GPU-h"),
    (Decimal("0.123456"), "", "0.123456 USD"),
    (Decimal("12345.6"), "", "12,345.60 USD"),
    (None, "", "-"),
])
def test_money_keeps_its_digits_and_says_its_currency(amount, per, text):
    assert output.money(amount, per=per) == text


@pytest.mark.parametrize(("delta", "text"), [
    (timedelta(hours=3), "in 3 h"),
    (timedelta(minutes=-12), "12 min ago"),
    (timedelta(seconds=20), "now"),
    (timedelta(days=3, hours=1), "in 3 d"),
    (timedelta(hours=-30), "30 h ago"),
])
def test_times_are_relative_to_now(delta, text):
    assert output.relative(NOW + delta, now=NOW) == text


def test_a_table_is_aligned_and_cut_to_the_width():
    rows = [[1, "active", "a very long reason that does not fit"], [22, "failed", "short"]]

    text = output.table(rows, ["ID", "STATE", "REASON"], max_width=30, right={0})

    assert text.splitlines() == ["ID  STATE   REASON",
                                 " 1  active  a very long reaso…",
                                 "22  failed  short"]
    assert max(len(line) for line in text.splitlines()) <= 30


def test_colour_only_on_a_terminal(monkeypatch):
    assert output.state("active", io.StringIO()) == "active"
    assert output.state("active", Tty()) == "\033[32mactive\033[0m"
    monkeypatch.setenv("NO_COLOR", "1")
    assert output.state("active", Tty()) == "active"


def test_the_spinner_spins_only_on_a_terminal():
    quiet, loud = io.StringIO(), Tty()
    for stream in (quiet, loud):
        spinner = output.Spinner(stream)
        spinner.tick("lease 7 placing")
        spinner.done()

    assert quiet.getvalue() == ""
    assert "lease 7 placing" in loud.getvalue() and loud.getvalue().endswith("\r\033[K")


def test_prices_of_parts_read_per_slice_or_share_hour():
    from types import SimpleNamespace as NS

    from ibex_client.cli import lease_unit, unit_of

    assert unit_of({"gpus": 8}) == "GPU-h"
    assert unit_of({"mig_profile": "1g.10gb"}) == "slice-h"
    assert unit_of({"share": 250}) == "share-h"
    assert lease_unit(NS(mig_profile="", gpu_share=250)) == "share-h"
    assert lease_unit(NS(mig_profile="3g.40gb", gpu_share=None)) == "slice-h"

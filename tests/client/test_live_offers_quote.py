"""`ibex offers` and `ibex quote` against the live API (`GET /api/v1/offers/`,
`POST /api/v1/quote/`): the rows and keys of offers, the query language's errors naming `q`,
and a quote that the order placed right after it matches. These need the server's offers and
quote endpoints (branch h-offers)."""

from decimal import Decimal

import pytest

from market.models import Lease
from tests.client.live import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

OFFER_KEYS = {"model", "fabric", "leaf", "provider", "gpus", "price_per_gpu_hour",
              "max_price_per_gpu_hour", "leaf_free", "spine_free", "reliability",
              "mig_profiles", "shares"}
QUOTE_KEYS = {"fillable", "tier", "gpus", "price_per_gpu_hour", "total", "locality",
              "placement", "reason", "max_price_per_gpu_hour"}
ASK = ("--gpus", "16", "--model", "H100-80GB", "--within", "leaf", "--hours", "4")


def test_offers_show_the_free_gpus_grouped_and_filtered(exchange):
    grouped = exchange.ibex("offers", "--group-by", "model,fabric", "--json")

    assert grouped.code == 0, grouped.err
    assert all(set(row) == OFFER_KEYS for row in grouped.json)
    (row,) = [r for r in grouped.json if r["model"] == "H100-80GB"]
    assert (row["fabric"], row["gpus"], row["price_per_gpu_hour"]) == ("lab", 16, "2.00")
    assert row["leaf"] is None and row["provider"] is None

    assert [r["model"] for r in exchange.ibex("offers", "model=H100-80GB", "--json").json] \
        == ["H100-80GB"]
    assert exchange.ibex("offers", "model=A100-80GB", "--json").json == []
    assert len(exchange.ibex("offers", "--group-by", "model,fabric,leaf", "--limit", "1",
                             "--json").json) == 1

    people = exchange.ibex("offers", "--group-by", "model,fabric")
    assert people.code == 0
    assert people.out.splitlines()[0].split()[:4] == ["MODEL", "FABRIC", "GPUS", "PRICE"]
    assert "2.00 USD/GPU-h" in people.out


@pytest.mark.parametrize("query", ["model=H100-80GB colour=red", "model=H100-80GB =="])
def test_a_malformed_query_is_refused_naming_the_term(exchange, query):
    refused = exchange.ibex("offers", query, "--json")

    assert refused.code == 1
    assert refused.json["error"]["field"] == "q"
    assert refused.err.startswith("ibex: q: term 2")


def test_the_order_placed_after_a_quote_gets_what_was_quoted(exchange):
    quoted = exchange.ibex("quote", *ASK, "--json")

    assert quoted.code == 0, quoted.err
    quote = quoted.json
    assert set(quote) == QUOTE_KEYS
    assert quote["fillable"] is True and quote["gpus"] == 16
    assert Decimal(quote["price_per_gpu_hour"]) == Decimal("2.00")
    assert Decimal(quote["total"]) == Decimal("2.00") * 16 * 4
    assert quote["locality"]["leaves"] == 1

    placed = exchange.ibex("order", *ASK, "--wait", "--timeout", "90", "--json")
    assert placed.code == 0, placed.err
    lease = placed.json["lease"]
    # without --max-price, quoted again and placed under the quote's limit
    assert placed.json["order"]["max_price_per_gpu_hour"] == quote["max_price_per_gpu_hour"]
    assert Decimal(lease["price_per_gpu_hour"]) == Decimal(quote["price_per_gpu_hour"])
    assert sorted((g["node"], g["index"]) for g in lease["gpus"]) == sorted(
        (p["node"], p["index"]) for p in quote["placement"])
    assert wait_for(lambda: exchange.lease_state(lease["id"]) == "active", "the lease")
    assert Lease.objects.get(pk=lease["id"]).gpu_count == 16


def test_a_quote_nothing_can_fill_is_exit_1_with_the_reason(exchange):
    # 16 GPUs on one node of eight: the fabric has them, no node does
    refused = exchange.ibex("quote", "--gpus", "16", "--model", "H100-80GB", "--within",
                            "node", "--hours", "1", "--json")

    assert refused.code == 1
    assert refused.json["fillable"] is False and refused.json["reason"]
    assert refused.err.startswith("ibex: not fillable: ")

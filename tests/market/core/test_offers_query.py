"""The offers query language over plain text (market.core.offers_query): no database."""

from decimal import Decimal

import pytest

from market.core.offers_query import (
    OffersQuery,
    QueryError,
    Term,
    parse_group_by,
    parse_limit,
    parse_offers_query,
    parse_query,
    parse_sort,
)


def test_an_empty_query_has_no_terms():
    assert parse_query("") == ()
    assert parse_query("   ") == ()


def test_terms_are_field_op_value_separated_by_spaces():
    assert parse_query("model=H100-80GB gpus>=64  price<=2.50") == (
        Term("model", "=", "H100-80GB", 1, 1),
        Term("gpus", ">=", 64, 2, 17),
        Term("price", "<=", Decimal("2.50"), 3, 27),
    )


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_every_comparison_operator_parses(op):
    assert parse_query(f"leaf_free{op}8") == (Term("leaf_free", op, 8, 1, 1),)


def test_spaces_around_the_operator_are_allowed():
    assert parse_query("gpus >= 8 model = A100-80GB") == (
        Term("gpus", ">=", 8, 1, 1), Term("model", "=", "A100-80GB", 2, 11))


def test_in_takes_a_list_of_bare_or_quoted_values():
    assert parse_query('provider in [acme, "big dc",x]') == (
        Term("provider", "in", ("acme", "big dc", "x"), 1, 1),)
    assert parse_query("gpus in [8,16]")[0].value == (8, 16)


def test_quoted_strings_keep_spaces_and_escapes():
    assert parse_query(r'fabric="a \"b\" c\\"')[0].value == 'a "b" c\\'


def test_numbers_are_typed_per_field():
    price, reliability = parse_query("price>0.000001 reliability>=0.999")
    assert price.value == Decimal("0.000001")
    assert reliability.value == Decimal("0.999")


def test_share_takes_true_false_or_a_size():
    assert [t.value for t in parse_query("share=true share=false share>=250")] == [
        True, False, 250]


def test_per_gpu_and_per_group_terms_are_told_apart():
    query = OffersQuery(terms=parse_query("model=H100-80GB gpus>=8 share=true price<3"))
    assert [t.field for t in query.per_gpu()] == ["model", "share"]
    assert [t.field for t in query.per_group()] == ["gpus", "price"]


@pytest.mark.parametrize(("text", "message"), [
    ("gpus>=8 colour=red", "term 2 at column 9: unknown field 'colour' (fields: model, gpus, "
                           "price, leaf_free, spine_free, reliability, fabric, provider, "
                           "mig_profile, share)"),
    (">=8", "term 1 at column 1: expected a field name, found '>' (fields: model, gpus, price, "
            "leaf_free, spine_free, reliability, fabric, provider, mig_profile, share)"),
    ("gpus", "term 1 at column 5: expected an operator after 'gpus' (=, !=, <, <=, >, >=, in),"
             " found the end of the query"),
    ("gpus~8", "term 1 at column 5: expected an operator after 'gpus' (=, !=, <, <=, >, >=, "
               "in), found '~'"),
    ("model<H100", "term 1 at column 6: model takes =, !=, in, not '<'"),
    ("share<250", "term 1 at column 6: share takes =, >=, >, not '<'"),
    ("gpus>=", "term 1 at column 7: gpus>=: expected a value, found the end of the query"),
    ("gpus>=eight", "term 1 at column 7: gpus: expected a whole number, found 'eight'"),
    ("gpus>=8.5", "term 1 at column 7: gpus: expected a whole number, found '8.5'"),
    ('gpus>="8"', "term 1 at column 7: gpus: expected a number, found the string '8'"),
    ("price<=cheap", "term 1 at column 8: price: expected a number like 2.49, found 'cheap'"),
    ("price<=1e3", "term 1 at column 8: price: expected a plain number like 2.49, found '1e3'"),
    ("reliability>1.5", "term 1 at column 13: reliability is a fraction from 0 to 1, found "
                        "'1.5'"),
    ("share>=1000", "term 1 at column 8: share: expected true, false or a size in thousandths "
                    "(1-999), found '1000'"),
    ("share>=true", "term 1 at column 8: share>= takes a size in thousandths (1-999), not true"),
    ('model="H100', "term 1 at column 7: a quoted value is not closed (a \" is missing)"),
    ("model in [a,b", "term 1 at column 10: a list is not closed (a ] is missing)"),
    ("model in []", "term 1 at column 11: an empty list matches nothing: name at least one "
                    "value"),
    ("model in [a b]", "term 1 at column 13: expected , or ] in the list, found 'b'"),
    ("model in a", "term 1 at column 10: model in: expected a list like [a,b]"),
    ("model=[a]", "term 1 at column 7: a list goes with `in`, not '='"),
    ("model=a]", "term 1 at column 8: unexpected ']' in a value (quote values that hold it)"),
    ('model="a"gpus=8', "term 1 at column 10: expected a space before the next term, found 'g'"),
    ('model=""', "term 1 at column 7: model: expected a non-empty value"),
])
def test_each_error_names_the_term_and_column(text, message):
    with pytest.raises(QueryError) as refused:
        parse_query(text)
    assert str(refused.value) == message
    assert refused.value.param == "q"


def test_a_query_has_a_length_limit():
    with pytest.raises(QueryError, match="at most 2000 characters"):
        parse_query("gpus>=1 " * 300)


def test_group_by_defaults_to_model_and_always_keeps_it():
    assert parse_group_by(None) == ("model",)
    assert parse_group_by("provider, leaf") == ("model", "leaf", "provider")
    with pytest.raises(QueryError, match="unknown group key 'spine'") as refused:
        parse_group_by("spine")
    assert refused.value.param == "group_by"


def test_sort_takes_a_minus_before_or_after_for_descending():
    assert parse_sort(None, ("model",)) == ("price", False)
    assert parse_sort("-price", ("model",)) == ("price", True)
    assert parse_sort("price-", ("model",)) == ("price", True)
    assert parse_sort("leaf", ("model", "leaf")) == ("leaf", False)
    for bad in ("leaf", "colour", "-price-"):
        with pytest.raises(QueryError) as refused:
            parse_sort(bad, ("model",))
        assert refused.value.param == "sort"


def test_limit_is_1_to_1000_default_50():
    assert parse_limit(None) == 50
    assert parse_limit("1000") == 1000
    for bad in ("0", "1001", "ten", "-1"):
        with pytest.raises(QueryError) as refused:
            parse_limit(bad)
        assert refused.value.param == "limit"


def test_the_four_parameters_together():
    assert parse_offers_query(q="gpus>=8", group_by="fabric", sort="gpus-", limit="5") == (
        OffersQuery(terms=(Term("gpus", ">=", 8, 1, 1),), group_by=("model", "fabric"),
                    sort="gpus", descending=True, limit=5))

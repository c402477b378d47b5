"""`ibex bid --alternative SPEC ...` and `Client.bid(alternatives=...)`: a bid over 2 to 8
shapes, at most one of which wins; its price to win once a clearing refused it."""

import json
from decimal import Decimal

import pytest

from ibex_client import Client
from ibex_client.errors import ApiError
from ibex_client.models import Order
from tests.client.samples import ORDER

H100_LEAF = "gpus=16,model=H100-80GB,within=leaf,hours=4,price=2.40"
H200_OR_B200 = "gpus=16,model=H200|B200,hours=4,price=2.90"
A100_SPINE = "gpus=32, model=A100-80GB, prefer=spine, hours=4, price=1.50"

SHAPES = [{"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 4,
           "max_price_per_gpu_hour": "2.40", "topology": {"required": "leaf"}},
          {"gpu_models": ["H200", "B200"], "gpus": 16, "hours": 4,
           "max_price_per_gpu_hour": "2.90", "topology": {}},
          {"gpu_models": ["A100-80GB"], "gpus": 32, "hours": 4,
           "max_price_per_gpu_hour": "1.50", "topology": {"preferred": "spine"}}]
RESTING_BID = {**ORDER, "id": 41, "state": "resting", "reason": "waiting for the next clearing",
               "lease": None, "tier": "spot", "gpu_models": ["H100-80GB"], "gpus": 16,
               "hours": 4, "max_price_per_gpu_hour": "2.40", "alternatives": SHAPES,
               "alternative": None, "price_to_win": None, "price_to_win_reason": ""}


@pytest.fixture
def bids(stub):
    stub.answer("POST", "/api/v1/orders/", (201, RESTING_BID))
    return stub


def sent(stub):
    return stub.requests_to("/api/v1/orders/")[-1].body


def test_a_bid_over_alternatives_sends_each_shape_and_no_shape_of_its_own(bids, ibex):
    code, out, err = ibex("bid", "--alternative", H100_LEAF, "--alternative", H200_OR_B200,
                          "--alternative", A100_SPINE, "--fill", "rest")

    assert code == 0, err
    assert sent(bids) == {"tier": "spot", "fill": "rest", "alternatives": [
        {"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 4,
         "max_price_per_gpu_hour": "2.40", "topology": {"required": "leaf"}},
        {"gpu_models": ["H200", "B200"], "gpus": 16, "hours": 4,
         "max_price_per_gpu_hour": "2.90"},
        {"gpu_models": ["A100-80GB"], "gpus": 32, "hours": 4,
         "max_price_per_gpu_hour": "1.50", "topology": {"preferred": "spine"}}]}
    assert out.splitlines() == [
        "order 41 resting (waiting for the next clearing)",
        "  alternative 1  16 × H100-80GB, within one leaf, 4 h, limit 2.40 USD/GPU-h",
        "  alternative 2  16 × H200|B200, 4 h, limit 2.90 USD/GPU-h",
        "  alternative 3  32 × A100-80GB, one spine preferred, 4 h, limit 1.50 USD/GPU-h"]


def test_a_reserved_bid_over_alternatives_keeps_its_start_window(bids, ibex):
    code, _, err = ibex("bid", "--tier", "reserved", "--start-after", "2030-01-01T00:00:00Z",
                        "--alternative", H100_LEAF, "--alternative", H200_OR_B200)

    assert code == 0, err
    body = sent(bids)
    assert body["tier"] == "reserved" and len(body["alternatives"]) == 2
    assert body["start_window"] == {"earliest": "2030-01-01T00:00:00Z",
                                    "latest": "2030-01-01T00:00:00Z"}


@pytest.mark.parametrize(("spec", "says"), [
    ("gpus=16,model=H100-80GB,hours=4,cost=2", "--alternative 2: cost: unknown key"),
    ("gpus=many,model=H100-80GB,hours=4,price=2", "--alternative 2: gpus: not a whole number"),
    ("gpus=16,model=H100-80GB,hours=0,price=2", "--alternative 2: hours: not a whole number"),
    ("gpus=16,model=H100-80GB,hours=4", "--alternative 2: price: missing"),
    ("gpus=16,model=H100-80GB,hours=4,price=cheap", "--alternative 2: price: not an amount"),
    ("gpus=16,model=H100-80GB,hours=4,price=2,within=rack", "--alternative 2: within: one of"),
    ("gpus=16,model=H100-80GB,hours=4,price=2,within=leaf,prefer=node",
     "--alternative 2: prefer: give within or prefer, not both"),
    ("gpus=16,model=A,model=B,hours=4,price=2", "--alternative 2: model: given twice"),
    ("gpus=16,model=A|,hours=4,price=2", "--alternative 2: model: a GPU model"),
    ("gpus=16,model=H100-80GB,hours=4,price=2,", "--alternative 2: not KEY=VALUE"),
])
def test_a_bad_spec_is_exit_2_naming_the_alternative_and_its_key(stub, ibex, spec, says):
    code, _, err = ibex("bid", "--alternative", H100_LEAF, "--alternative", spec)

    assert code == 2
    assert says in err
    assert stub.seen == []


@pytest.mark.parametrize(("args", "says"), [
    (("bid", "--alternative", H100_LEAF), "give 2 to 8 --alternative (1 given)"),
    (("bid", *["--alternative", H100_LEAF] * 9), "give 2 to 8 --alternative (9 given)"),
    (("bid", "--gpus", "8", "--max-price", "2", "--alternative", H100_LEAF,
      "--alternative", H200_OR_B200), "--alternative replaces --gpus, --max-price"),
    (("bid", "--model", "H100-80GB", "--hours", "2", "--alternative", H100_LEAF,
      "--alternative", H200_OR_B200), "--alternative replaces --model, --hours"),
    (("quote", "--alternative", H100_LEAF, "--alternative", H200_OR_B200),
     "ibex quote prices one shape"),
    (("order", "--alternative", H100_LEAF, "--alternative", H200_OR_B200),
     "--alternative is for auction bids"),
    (("bid", "--gpus", "8", "--hours", "1"), "required: --model, --max-price"),
])
def test_alternatives_mixed_with_a_shape_or_outside_a_bid_are_exit_2(stub, ibex, args, says):
    code, _, err = ibex(*args)

    assert code == 2
    assert says in err
    assert stub.seen == []


def test_an_order_with_tier_spot_may_bid_over_alternatives_too(bids, ibex):
    code, _, err = ibex("order", "--tier", "spot", "--alternative", H100_LEAF,
                        "--alternative", H200_OR_B200)

    assert code == 0, err
    assert [a["gpus"] for a in sent(bids)["alternatives"]] == [16, 16]
    assert bids.requests_to("/api/v1/quote/") == []  # each shape has its own limit


def test_the_python_client_builds_the_alternatives_json(bids):
    client = Client()

    order = client.bid(alternatives=[
        {"gpus": 16, "model": "H100-80GB", "within": "leaf", "hours": 4, "max_price": "2.40"},
        {"gpus": 16, "model": ["H200", "B200"], "hours": 4, "max_price": Decimal("2.90")}],
        idempotency_key="alt-1")

    assert sent(bids)["alternatives"][1] == {"gpu_models": ["H200", "B200"], "gpus": 16,
                                             "hours": 4, "max_price_per_gpu_hour": "2.90"}
    assert bids.requests_to("/api/v1/orders/")[-1].headers["Idempotency-Key"] == "alt-1"
    assert order.alternatives[1].gpu_models == ["H200", "B200"]
    assert order.alternatives[2].max_price_per_gpu_hour == Decimal("1.50")
    assert order.alternative is None


@pytest.mark.parametrize(("alternatives", "field"), [
    ([{"gpus": 16, "model": "H100-80GB", "hours": 4, "max_price": "2", "cost": 1}] * 2,
     "alternatives.0.cost"),
    ([{"gpus": 16, "model": "H100-80GB", "hours": 4, "max_price": "2"},
      {"gpus": 16, "model": "H100-80GB", "hours": 4}], "alternatives.1.max_price"),
])
def test_the_python_client_names_a_bad_alternative_and_sends_nothing(bids, alternatives,
                                                                     field):
    with pytest.raises(ApiError) as caught:
        Client().bid(alternatives=alternatives)

    assert caught.value.field == field
    assert bids.seen == []


def test_the_python_client_refuses_a_shape_beside_alternatives(bids):
    with pytest.raises(ApiError) as caught:
        Client().bid(gpus=8, alternatives=[{"gpus": 16, "model": "M", "hours": 1,
                                            "max_price": "1"}] * 2)

    assert caught.value.field == "alternatives" and "gpus" in caught.value.message
    assert bids.seen == []


def test_an_order_from_a_server_that_knows_no_alternatives_reads_as_none():
    order = Order.from_json(ORDER)  # no alternatives, alternative, price_to_win

    assert (order.alternatives, order.alternative, order.price_to_win,
            order.price_to_win_reason) == ([], None, None, "")


def test_orders_show_which_alternative_won_and_a_refused_bids_price_to_win(stub, ibex):
    won = {**RESTING_BID, "id": 41, "state": "filled", "reason": "", "lease": 9,
           "alternative": 1, "gpu_models": ["H200"], "max_price_per_gpu_hour": "2.90"}
    refused = {**RESTING_BID, "id": 42, "state": "refused",
               "reason": "outbid at the clearing of 10:05", "price_to_win": "2.415"}
    unplaceable = {**ORDER, "id": 43, "state": "refused", "tier": "spot",
                   "reason": "no fabric has a leaf of 64 free GPUs", "alternative": 0,
                   "price_to_win": None, "price_to_win_reason": "it fits in no leaf"}
    stub.answer("GET", "/api/v1/orders/", (200, {"next": None, "results": [won, refused,
                                                                             unplaceable]}))

    code, out, err = ibex("orders")

    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "won 2 of 3" in rows["41"] and "H200 " in rows["41"]
    assert "3 shapes" in rows["42"] and "16|16|32" in rows["42"]
    assert ("outbid at the clearing of 10:05; price to win: 2.415 USD/GPU-h"
            in rows["42"])
    assert "price to win: none (it fits in no leaf)" in rows["43"]
    listed = json.loads(ibex("orders", "--json")[1])
    assert [(o["alternative"], o["price_to_win"]) for o in listed] == [
        (1, None), (None, "2.415"), (0, None)]


def test_a_bid_refused_while_waiting_says_its_price_to_win(stub):
    stub.answer("GET", "/api/v1/orders/41/", (200, {
        **RESTING_BID, "state": "refused", "reason": "outbid", "price_to_win": "2.41"}))

    with pytest.raises(ApiError) as caught:
        Client().wait_active(41, timeout_s=5, poll_s=0.01)

    assert str(caught.value.message) == ("order 41 is refused: outbid (price to win: 2.41 per "
                                         "GPU-hour)")

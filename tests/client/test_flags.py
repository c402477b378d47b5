"""The grammar of `ibex`'s flags: what each command sends, and bad usage as exit 2."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.client.samples import OFFERS, ORDER, QUOTE

ORDER_ARGS = ("--gpus", "16", "--model", "H100-80GB", "--within", "leaf", "--hours", "2",
              "--max-price", "2.00")


@pytest.fixture
def orders(stub):
    stub.answer("POST", "/api/v1/orders/", (201, ORDER))
    stub.answer("POST", "/api/v1/quote/", (200, QUOTE))
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))
    return stub


def sent(stub, path="/api/v1/orders/"):
    return stub.requests_to(path)[-1]


def test_an_order_sends_the_fields_it_was_given(orders, ibex, tmp_path):
    keys = tmp_path / "id_ed25519.pub"
    keys.write_text("# mine\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA alice@laptop\n")

    code, _, err = ibex("order", "--gpus", "16", "--model", "H100-80GB", "--model", "A100-80GB",
                        "--within", "leaf", "--hours", "24", "--max-price", "2.10",
                        "--env", "WANDB_MODE=offline", "--workdir", "runs/a",
                        "--ssh-key", str(keys), "--command", "--",
                        "python3", "train.py", "--epochs", "3")

    assert code == 0, err
    assert sent(orders).body == {
        "gpu_models": ["H100-80GB", "A100-80GB"], "gpus": 16, "hours": 24,
        "tier": "on_demand", "max_price_per_gpu_hour": "2.10",
        "topology": {"required": "leaf"},
        "workload": {"command": ["python3", "train.py", "--epochs", "3"],
                     "env": {"WANDB_MODE": "offline"}, "workdir": "runs/a"},
        "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA alice@laptop"]}


@pytest.mark.parametrize(("flags", "fields"), [
    (("--mig-profile", "1g.10gb", "--count", "2"), {"mig_profile": "1g.10gb", "count": 2}),
    (("--share", "250", "--count", "1"), {"gpu_share": 250, "count": 1}),
])
def test_parts_of_gpus_are_a_profile_or_a_share_with_a_count(orders, ibex, flags, fields):
    code, _, err = ibex("order", *flags, "--model", "A100-80GB", "--hours", "1",
                        "--max-price", "0.50", "--prefer-within", "node")

    assert code == 0, err
    assert sent(orders).body == {"gpu_models": ["A100-80GB"], "hours": 1, "tier": "on_demand",
                                 "max_price_per_gpu_hour": "0.50",
                                 "topology": {"preferred": "node"}, **fields}


def test_a_reserved_bid_carries_its_start_window(orders, ibex):
    before = datetime.now(UTC)  # "+2h" is read against the real clock, so is the window's end
    latest = (before + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")

    code, _, err = ibex("bid", "--tier", "reserved", "--gpus", "8", "--model", "H100-80GB",
                        "--hours", "48", "--max-price", "1.80", "--start-after", "+2h",
                        "--start-before", latest)

    assert code == 0, err
    body = sent(orders).body
    assert body["tier"] == "reserved"
    earliest = datetime.fromisoformat(body["start_window"]["earliest"].replace("Z", "+00:00"))
    assert timedelta(hours=2) <= earliest - before < timedelta(hours=2, minutes=1)
    assert body["start_window"]["latest"] == latest


def test_a_fresh_idempotency_key_is_sent_and_printed_and_a_given_one_reused(orders, ibex):
    code, _, err = ibex("order", *ORDER_ARGS)
    assert code == 0
    key = sent(orders).headers["Idempotency-Key"]
    assert key.startswith("ibex-cli-") and f"idempotency key: {key}" in err

    code, out, _ = ibex("order", *ORDER_ARGS, "--idempotency-key", "retry-1", "--json")
    assert code == 0
    assert sent(orders).headers["Idempotency-Key"] == "retry-1"
    assert json.loads(out)["order"]["idempotency_key"] == "retry-1"


def test_without_a_limit_the_order_is_quoted_first_under_the_dearest_price_on_offer(orders,
                                                                                   ibex):
    code, _, err = ibex("order", "--gpus", "16", "--model", "H100-80GB", "--within", "leaf",
                        "--hours", "2")

    assert code == 0, err
    assert orders.requests_to("/api/v1/offers/")[-1].query == {"group_by": "model"}
    quoted = sent(orders, "/api/v1/quote/").body
    assert quoted["max_price_per_gpu_hour"] == "2.80"  # the dearest H100-80GB on offer
    assert sent(orders).body == quoted
    assert ("quoted 2.00 USD/GPU-h, total 64.00 USD; limit 2.80 USD/GPU-h (the dearest on "
            "offer)") in err


def test_global_options_go_before_or_after_the_command(stub, ibex):
    stub.answer("GET", "/api/v1/orders/", (200, {"next": None, "previous": None,
                                                 "results": [ORDER]}))

    for args in (("--json", "orders"), ("orders", "--json"), ("--profile", "x", "orders",
                                                              "--json")):
        code, out, err = ibex(*args)
        assert code == 0, err
        assert json.loads(out)[0]["id"] == 12


@pytest.mark.parametrize(("args", "says"), [
    (("order", "--gpus", "16", "--hours", "2"), "--model"),
    (("order", "--model", "H100-80GB", "--hours", "2"), "exactly one of --gpus"),
    (("order", "--gpus", "1", "--share", "250", "--count", "1", "--model", "M", "--hours", "1"),
     "exactly one of --gpus"),
    (("order", "--share", "250", "--model", "M", "--hours", "1"), "--share needs --count"),
    (("order", *ORDER_ARGS, "--command"), "--command takes the command after `--`"),
    (("order", *ORDER_ARGS, "--", "python3"), "need --command"),
    (("order", "--gpus", "16", "--model", "M", "--hours", "2", "--max-price", "cheap"),
     "not an amount"),
    (("order", *ORDER_ARGS, "--within", "rack"), "invalid choice"),
    (("order", *ORDER_ARGS, "--start-after", "tomorrow"), "not a time"),
    (("bid", "--gpus", "8", "--model", "M", "--hours", "1"), "--max-price"),
    (("bid", "--tier", "on_demand", "--gpus", "8", "--model", "M", "--hours", "1",
      "--max-price", "1"), "invalid choice"),
    (("extend", "7"), "--hours"),
    (("balance", "--", "x"), "takes nothing after --"),
    (("lease", "seven"), "not a whole number"),
    (("frobnicate",), "invalid choice"),
    (("provider", "drain", "gpu01", "--mode", "now"), "invalid choice"),
    (("provider", "price", "--price", "2.00"), "name what to price"),
])
def test_bad_usage_is_exit_2_and_sends_nothing(stub, ibex, args, says):
    code, out, err = ibex(*args)

    assert code == 2
    assert says in err
    assert stub.seen == []

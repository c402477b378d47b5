"""The Python client and the commands over it, against the stub API: the API's errors as one
exception, pages followed, retries with the same idempotency key, `--explain`, offers and
quotes (the server's side is `GET /offers/` and `POST /quote/`), `ssh`, and the stable keys of
every command's `--json`."""

import json
import os
import socket
import subprocess
from decimal import Decimal

import pytest

from ibex_client import ApiError, Client, Lease, Offer, Quote
from tests.client.conftest import KEY
from tests.client.samples import ACCOUNT, LEASE, OFFERS, ORDER, QUOTE, SLA, invalid

# --- errors ------------------------------------------------------------------------------------


def test_a_refusal_is_an_api_error_naming_the_field(stub, ibex):
    stub.answer("POST", "/api/v1/orders/", (400, invalid(
        "gpus", "Ensure this value is less than or equal to 100000.")))

    with pytest.raises(ApiError) as caught:
        Client().order(gpus=10**6, model="H100-80GB", hours=1, max_price="2.00")
    assert (caught.value.code, caught.value.field, caught.value.status) == ("invalid", "gpus",
                                                                            400)
    assert caught.value.message == "Ensure this value is less than or equal to 100000."

    code, out, err = ibex("order", "--gpus", "1000000", "--model", "H100-80GB", "--hours", "1",
                          "--max-price", "2", "--json")
    assert code == 1
    assert err.splitlines()[-1] == "ibex: gpus: Ensure this value is less than or equal to 100000."
    assert json.loads(out) == {"error": {
        "code": "invalid", "field": "gpus", "status": 400,
        "message": "Ensure this value is less than or equal to 100000.",
        "fields": {"gpus": ["Ensure this value is less than or equal to 100000."]}}}


def test_a_conflict_keeps_the_api_code_and_message(stub, ibex):
    stub.answer("POST", "/api/v1/leases/7/extend/", (409, {"error": {
        "code": "gpus_unavailable", "message": "gpu02/3 is leased from 12:00", "fields": {}}}))

    code, out, err = ibex("extend", "7", "--hours", "1")

    assert (code, out, err) == (1, "", "ibex: gpu02/3 is leased from 12:00\n")


def test_an_order_refused_on_the_spot_is_exit_1_with_why(stub, ibex):
    stub.answer("POST", "/api/v1/orders/", (201, {
        **ORDER, "state": "refused", "lease": None,
        "reason": "only 8 of 16 GPUs fit within one leaf"}))

    code, _, err = ibex("order", "--gpus", "16", "--model", "H100-80GB", "--hours", "1",
                        "--max-price", "2")

    assert code == 1
    assert err.splitlines()[-1] == "ibex: order 12 refused: only 8 of 16 GPUs fit within one leaf"


# --- pages and retries ------------------------------------------------------------------------


def test_pages_are_followed(stub):
    second = f"{stub.url}/api/v1/leases/?cursor=abc"
    stub.answer("GET", "/api/v1/leases/",
                (200, {"next": second, "previous": None, "results": [LEASE]}),
                (200, {"next": None, "previous": None, "results": [{**LEASE, "id": 6}]}))

    assert [x.id for x in Client().leases()] == [7, 6]
    assert stub.seen[1].query == {"cursor": "abc"}


def test_a_limit_stops_paging(stub):
    stub.answer("GET", "/api/v1/leases/", (200, {
        "next": f"{stub.url}/api/v1/leases/?cursor=abc", "previous": None,
        "results": [LEASE, {**LEASE, "id": 6}]}))

    assert [x.id for x in Client().leases(limit=1)] == [7]
    assert len(stub.seen) == 1


def test_a_5xx_is_retried_with_the_same_body_and_idempotency_key(stub):
    stub.answer("POST", "/api/v1/orders/", (503, b"busy"), (502, b"busy"), (201, ORDER))

    order = Client(backoff_s=0).order(gpus=16, model="H100-80GB", within="leaf", hours=2,
                                      max_price=Decimal("2.00"))

    assert order.id == 12
    tries = stub.requests_to("/api/v1/orders/")
    assert len(tries) == 3
    assert len({t.headers["Idempotency-Key"] for t in tries}) == 1
    assert all(t.body == tries[0].body for t in tries)
    assert order.idempotency_key == tries[0].headers["Idempotency-Key"]


def test_a_post_without_an_idempotency_key_is_not_repeated(stub):
    stub.answer("POST", "/api/v1/leases/7/extend/", (503, b"busy"), (200, LEASE))

    with pytest.raises(ApiError) as caught:
        Client(backoff_s=0).extend(7, hours=1)

    assert caught.value.status == 503
    assert len(stub.requests_to("/api/v1/leases/7/extend/")) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_errors_are_retried_then_reported(monkeypatch):
    monkeypatch.setenv("IBEX_API", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("IBEX_API_KEY", KEY)
    tried = []

    with pytest.raises(ApiError) as caught:
        Client(retries=2, backoff_s=0, explain=tried.append).balance()

    assert caught.value.code == "unreachable" and caught.value.status is None
    assert len(tried) == 3


def test_money_is_never_a_float(stub):
    with pytest.raises(TypeError):
        Client().order(gpus=1, model="H100-80GB", hours=1, max_price=2.1)
    assert stub.seen == []


# --- --explain ---------------------------------------------------------------------------------


def test_explain_prints_curl_lines_without_the_key_that_run_as_printed(stub, ibex):
    stub.answer("GET", "/api/v1/account/", (200, ACCOUNT))

    code, out, err = ibex("balance", "--json", "--explain")

    assert code == 0
    assert KEY not in err
    curl = [line for line in err.splitlines() if line.startswith("curl ")]
    assert curl == [f"curl -sS -X GET {stub.url}/api/v1/account/ "
                    f"-H \"Authorization: Bearer $IBEX_API_KEY\" -H 'Accept: application/json'"]
    ran = subprocess.run(["bash", "-c", curl[0]], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "IBEX_API_KEY": KEY})
    assert json.loads(ran.stdout) == ACCOUNT
    assert stub.seen[-1].headers["Authorization"] == f"Bearer {KEY}"


def test_explain_shows_the_body_and_idempotency_key_of_a_post(stub, ibex):
    stub.answer("POST", "/api/v1/orders/", (201, ORDER))

    code, _, err = ibex("order", "--gpus", "16", "--model", "H100-80GB", "--hours", "2",
                        "--max-price", "2.00", "--idempotency-key", "k-1", "--explain")

    assert code == 0
    assert ("curl -sS -X POST " + stub.url + "/api/v1/orders/ -H \"Authorization: Bearer "
            "$IBEX_API_KEY\" -H 'Accept: application/json' -H 'Content-Type: application/json' "
            "-H 'Idempotency-Key: k-1' --data-raw '{\"gpu_models\":[\"H100-80GB\"],\"hours\":2,"
            "\"tier\":\"on_demand\",\"gpus\":16,\"max_price_per_gpu_hour\":\"2.00\"}'"
            ) in err.splitlines()


# --- offers and quotes --------------------------------------------------------------------------


def test_offers_sends_the_query_and_reads_typed_rows(stub, ibex):
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))

    offers = Client().offers("model=H100-80GB gpus>=16", sort="price", group_by=["model",
                                                                                  "fabric"],
                             limit=10)

    assert stub.seen[-1].query == {"q": "model=H100-80GB gpus>=16", "sort": "price",
                                   "group_by": "model,fabric", "limit": "10"}
    assert offers[0] == Offer(model="H100-80GB", fabric="lab", leaf=None, provider=None,
                              gpus=64, price_per_gpu_hour=Decimal("2.49"),
                              max_price_per_gpu_hour=Decimal("2.80"), leaf_free=16,
                              spine_free=64, reliability=Decimal("0.9990"),
                              mig_profiles=["1g.10gb"], shares=True)

    code, out, _ = ibex("offers", "model=H100-80GB", "--sort", "price-", "--group-by",
                        "model,fabric")
    assert code == 0
    assert stub.seen[-1].query == {"q": "model=H100-80GB", "sort": "price-",
                                   "group_by": "model,fabric"}
    header, first, second = out.splitlines()
    assert header.split()[:4] == ["MODEL", "FABRIC", "GPUS", "PRICE"]
    assert first.split()[:5] == ["H100-80GB", "lab", "64", "2.49", "USD/GPU-h"]
    assert "99.90 %" in first and "1g.10gb,shares" in first
    assert second.split()[:3] == ["A100-80GB", "campus", "8"]


def test_a_malformed_query_is_exit_1_naming_q(stub, ibex):
    stub.answer("GET", "/api/v1/offers/", (400, invalid(
        "q", "term 2 at column 17: unknown field 'colour'")))

    code, out, err = ibex("offers", "model=H100-80GB colour=red")

    assert (code, out) == (1, "")
    assert err == "ibex: q: term 2 at column 17: unknown field 'colour'\n"


def test_a_quote_is_asked_with_the_order_body(stub, ibex):
    stub.answer("POST", "/api/v1/quote/", (200, QUOTE))
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))

    quote = Client().quote(gpus=16, model="H100-80GB", within="leaf", hours=24, tier="spot",
                           max_price="2.50")

    assert stub.seen[-1].body == {"gpu_models": ["H100-80GB"], "gpus": 16, "hours": 24,
                                  "tier": "spot", "topology": {"required": "leaf"},
                                  "max_price_per_gpu_hour": "2.50"}
    assert isinstance(quote, Quote) and quote.total == Decimal("64.00")
    assert quote.max_price_per_gpu_hour == Decimal("2.50")
    assert quote.placement[0].node == "gpu01"

    code, out, _ = ibex("quote", "--gpus", "16", "--model", "H100-80GB", "--within", "leaf",
                        "--hours", "24")
    assert code == 0
    assert out.splitlines() == [
        "16 GPUs of H100-80GB, on_demand, 24 h: 2.00 USD/GPU-h, total 64.00 USD",
        "locality: 1 leaf, 1 spine, at most 2 hops",
        "placement: gpu01/0,1,2,3,4,5,6,7, gpu02/0,1,2,3,4,5,6,7"]


def test_a_quote_of_models_not_on_offer_is_exit_1_naming_gpu_models(stub, ibex):
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))

    code, _, err = ibex("quote", "--gpus", "8", "--model", "B200", "--hours", "1")

    assert code == 1
    assert err == "ibex: gpu_models: no B200 is on offer now\n"
    assert stub.requests_to("/api/v1/quote/") == []


def test_a_quote_that_cannot_be_filled_is_exit_1_with_the_reason(stub, ibex):
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))
    stub.answer("POST", "/api/v1/quote/", (200, {
        "fillable": False, "tier": "on_demand", "gpus": 64, "price_per_gpu_hour": None,
        "total": None, "locality": None, "placement": [],
        "reason": "only 32 of 64 GPUs fit within one leaf"}))

    code, out, err = ibex("quote", "--gpus", "64", "--model", "H100-80GB", "--within", "leaf",
                          "--hours", "1", "--json")

    assert code == 1
    assert json.loads(out)["fillable"] is False
    assert err == "ibex: not fillable: only 32 of 64 GPUs fit within one leaf\n"


# --- waiting, ssh ---------------------------------------------------------------------------


def test_wait_active_follows_the_order_to_its_active_lease(stub):
    stub.answer("POST", "/api/v1/orders/", (201, {**ORDER, "state": "resting", "lease": None}))
    stub.answer("GET", "/api/v1/orders/12/", (200, {**ORDER, "state": "resting",
                                                   "lease": None}), (200, ORDER))
    stub.answer("GET", "/api/v1/leases/7/", (200, {**LEASE, "state": "placing"}), (200, LEASE))
    seen = []

    lease = Client().bid(gpus=16, model="H100-80GB", hours=2, max_price="2.00").wait_active(
        poll_s=0, on_poll=seen.append)

    assert isinstance(lease, Lease) and lease.state == "active"
    assert seen == ["order 12 resting", "order 12 resting", "lease 7 placing"]


def test_wait_active_says_why_a_lease_failed(stub):
    stub.answer("GET", "/api/v1/orders/12/", (200, ORDER))
    stub.answer("GET", "/api/v1/leases/7/", (200, {**LEASE, "state": "failed", "events": [
        {"at": None, "kind": "state", "from_state": "placing", "to_state": "failed",
         "actor": "scheduler", "reason": "could not be placed"}]}))

    with pytest.raises(ApiError) as caught:
        Client().wait_active(12, poll_s=0)

    assert (caught.value.code, caught.value.message) == (
        "lease_failed", "lease 7 is failed: could not be placed")


def test_ssh_execs_the_access_line_of_the_rank(stub, ibex, monkeypatch):
    stub.answer("GET", "/api/v1/leases/7/", (200, LEASE))
    ran = []
    monkeypatch.setattr("os.execvp", lambda program, argv: ran.append((program, argv)))

    assert ibex("ssh", "7", "--", "-L", "8888:localhost:8888")[0] == 0
    assert ibex("ssh", "7", "--node-rank", "1")[0] == 0

    assert ran == [("ssh", ["ssh", "-p", "2222", "ibex-l7@10.0.0.1", "-L",
                            "8888:localhost:8888"]),
                   ("ssh", ["ssh", "-p", "2222", "ibex-l7@10.0.0.2"])]
    code, _, err = ibex("ssh", "7", "--node-rank", "2")
    assert code == 1 and "its ranks are 0..1" in err


def test_ssh_to_a_lease_without_keys_says_how_to_get_in(stub, ibex):
    stub.answer("GET", "/api/v1/leases/7/", (200, {**LEASE, "access": [
        {"node": "gpu01", "ssh": None, "slurm": None}]}))

    code, _, err = ibex("ssh", "7")

    assert code == 1
    assert "ssh_keys: gpu01 offers no SSH for lease 7: order with --ssh-key" in err


# --- stable keys of --json ----------------------------------------------------------------------

LEASE_KEYS = {"id", "state", "tier", "gpu_model", "gpu_count", "mig_profile", "gpu_share",
              "gpus", "locality", "price_per_gpu_hour", "max_price_per_gpu_hour", "starts_at",
              "ends_at", "ended_at", "preempt_at", "created_at", "workload", "access", "events",
              "sla", "bandwidth", "fabric"}
ORDER_KEYS = {"id", "state", "reason", "lease", "gpu_models", "gpus", "mig_profile",
              "gpu_share", "hours", "tier", "max_price_per_gpu_hour", "topology",
              "start_window", "workload", "ssh_keys", "created_at", "alternatives",
              "alternative", "price_to_win", "price_to_win_reason", "bandwidth",
              "idempotency_key"}


@pytest.mark.parametrize(("args", "keys"), [
    (("lease", "7"), LEASE_KEYS),
    (("extend", "7", "--hours", "1"), LEASE_KEYS),
    (("terminate", "7"), LEASE_KEYS),
    (("cancel", "12"), ORDER_KEYS),
    (("balance",), {"organization", "currency", "available", "held", "payable", "held_back",
                    "spend_limit_per_hour", "spend_limit_per_month"}),
    (("order", "--gpus", "16", "--model", "H100-80GB", "--hours", "2", "--max-price", "2"),
     {"order", "lease"}),
    (("quote", "--gpus", "16", "--model", "H100-80GB", "--hours", "2"),
     {"fillable", "tier", "gpus", "price_per_gpu_hour", "total", "locality", "placement",
      "reason", "max_price_per_gpu_hour"}),
])
def test_json_output_has_stable_keys_whatever_the_server_adds(stub, ibex, args, keys):
    extra = {"added_by_a_newer_server": 1}
    stub.answer("GET", "/api/v1/leases/7/", (200, {**LEASE, **extra}))
    stub.answer("GET", "/api/v1/leases/7/sla/", (200, SLA))
    stub.answer("POST", "/api/v1/leases/7/extend/", (200, {**LEASE, **extra}))
    stub.answer("POST", "/api/v1/leases/7/terminate/", (200, {**LEASE, **extra}))
    stub.answer("POST", "/api/v1/orders/12/cancel/", (200, {**ORDER, "state": "cancelled",
                                                           **extra}))
    stub.answer("GET", "/api/v1/account/", (200, {**ACCOUNT, **extra}))
    stub.answer("POST", "/api/v1/orders/", (201, {**ORDER, **extra}))
    stub.answer("POST", "/api/v1/quote/", (200, {**QUOTE, **extra}))
    stub.answer("GET", "/api/v1/offers/", (200, OFFERS))

    code, out, err = ibex(*args, "--json")

    assert code == 0, err
    assert set(json.loads(out)) == keys


def test_money_and_times_in_json_are_strings(stub, ibex):
    stub.answer("GET", "/api/v1/leases/7/", (200, LEASE))
    stub.answer("GET", "/api/v1/leases/7/sla/", (200, SLA))

    lease = json.loads(ibex("lease", "7", "--json")[1])

    assert lease["price_per_gpu_hour"] == "2.000000"
    assert lease["ends_at"] == "2026-01-05T12:00:00Z"
    assert lease["sla"]["availability_target_percent"] == "99.50"
    assert lease["access"][0] == {"node": "gpu02", "ssh": "ssh -p 2222 ibex-l7@10.0.0.2",
                                  "slurm": None}

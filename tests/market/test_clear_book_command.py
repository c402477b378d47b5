"""`manage.py clear_book BOOK.json`: a book in, its clearing out as JSON, no database."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

REPO_ROOT = Path(__file__).resolve().parents[2]

BOOK = {
    "levels": ["spine", "leaf", "node"],
    "nodes": [
        {"name": "n1", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l0"},
         "reserve_prices": ["2.10", "2.10", "2.35"]},
        {"name": "n2", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l1"},
         "reserve_prices": ["1.90", "1.90", "1.90", "1.90"]},
        {"name": "n3", "gpu_model": "H200", "labels": {"spine": "s0", "leaf": "l1"},
         "reserve_prices": ["3.00", "3.00"]},
    ],
    "bids": [
        {"id": "b1", "gpus": 4, "hours": "4", "max_price_per_gpu_hour": "2.50",
         "gpu_models": ["H100"], "topology": {"required": "leaf"}},
        {"id": "b2", "gpus": 2, "hours": 10, "max_price_per_gpu_hour": "2.40",
         "gpu_models": ["H100"]},
        {"id": "b3", "alternatives": [
            {"gpus": 3, "hours": "2", "max_price_per_gpu_hour": "3.00", "gpu_models": ["H100"],
             "topology": {"required": "node"}},
            {"gpus": 2, "hours": "1", "max_price_per_gpu_hour": "3.50", "gpu_models": ["H200"]},
        ]},
    ],
}


def clear_book(tmp_path, book, *args):
    path = tmp_path / "book.json"
    path.write_text(json.dumps(book))
    return subprocess.run([sys.executable, "manage.py", "clear_book", str(path), *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, env=os.environ.copy(),
                          timeout=120)


def test_a_book_is_cleared_and_printed_as_json(tmp_path):
    path = tmp_path / "book.json"
    path.write_text(json.dumps(BOOK))
    out = StringIO()
    call_command("clear_book", str(path), stdout=out)
    answer = json.loads(out.getvalue())
    markets = {market["gpu_model"]: market for market in answer["markets"]}
    assert set(markets) == {"H100", "H200"}
    h100 = markets["H100"]
    assert set(h100) == {"gpu_model", "clearing_price", "welfare", "welfare_bound", "gap",
                         "optimal", "accepted", "refused"}
    assert h100["welfare"] == "15.60" and h100["welfare_bound"] == "15.60"
    assert h100["optimal"] is True and h100["gap"] == "0.000000"
    assert {a["id"]: a["assignment"] for a in h100["accepted"]} == {"b1": {"n2": 4},
                                                                    "b2": {"n1": 2}}
    for accepted in h100["accepted"]:
        assert set(accepted) == {"id", "alternative", "assignment", "price"}
        assert accepted["alternative"] == 0 and accepted["price"] == h100["clearing_price"]
    # b3 wins with its second shape, in the other market
    assert markets["H200"]["accepted"] == [
        {"id": "b3", "alternative": 1, "assignment": {"n3": 2}, "price": "3.00"}]


def test_a_refused_bid_gets_its_price_to_win(tmp_path):
    book = copy.deepcopy(BOOK)
    book["bids"][2]["alternatives"][1]["max_price_per_gpu_hour"] = "2.50"  # below H200's 3.00
    path = tmp_path / "book.json"
    path.write_text(json.dumps(book))
    out = StringIO()
    call_command("clear_book", str(path), stdout=out)
    refused = [r for m in json.loads(out.getvalue())["markets"] for r in m["refused"]]
    # its first shape needs the smaller raise: $3.12 (from $3.00) beats $3.01 (from $2.50)
    assert [(r["id"], r["price_to_win"]) for r in refused] == [("b3", "3.12")]
    assert set(refused[0]) == {"id", "reason", "price_to_win"}


def test_a_bid_that_fits_nowhere_has_no_price_and_says_why(tmp_path):
    book = copy.deepcopy(BOOK)
    book["bids"].append({"id": "huge", "gpus": 64, "hours": "1",
                         "max_price_per_gpu_hour": "9.00", "gpu_models": ["H100"]})
    path = tmp_path / "book.json"
    path.write_text(json.dumps(book))
    out = StringIO()
    call_command("clear_book", str(path), stdout=out)
    refused = {r["id"]: r for m in json.loads(out.getvalue())["markets"] for r in m["refused"]}
    assert refused["huge"]["price_to_win"] is None
    assert "fits nowhere" in refused["huge"]["reason"]


@pytest.mark.parametrize(("change", "path"), [
    (lambda b: b["bids"][1].update(max_price_per_gpu_hour="2.4x"),
     "bids[1].max_price_per_gpu_hour: not a price"),
    (lambda b: b["nodes"][0]["reserve_prices"].__setitem__(2, 2.35),
     "nodes[0].reserve_prices[2]: not a price"),
    (lambda b: b["bids"][2]["alternatives"].pop(),
     "bids[2].alternatives: give 2 to 8 alternatives, not 1"),
    (lambda b: b["bids"][2].update(gpus=2),
     "bids[2].alternatives: give either one shape or alternatives"),
    (lambda b: b["bids"][2]["alternatives"][0].pop("gpu_models"),
     "bids[2].alternatives[0].gpu_models: names no market"),
    (lambda b: b["bids"][0].update(gpu_models=["B200"]),
     "bids[0].gpu_models: names no market in this book"),
    (lambda b: b["bids"][0]["topology"].update(required="rack"),
     "bids[0].topology.required: unknown level"),
    (lambda b: b["nodes"][1]["labels"].pop("leaf"), "nodes[1].labels.leaf"),
    (lambda b: b["bids"][1].update(hours="0"), "bids[1].hours: must be positive"),
])
def test_a_malformed_book_is_refused_with_the_json_path_and_nothing_on_stdout(
        tmp_path, change, path):
    book = copy.deepcopy(BOOK)
    change(book)
    result = clear_book(tmp_path, book)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().startswith(path), result.stderr


def test_a_book_that_is_not_json_is_refused(tmp_path):
    path = tmp_path / "book.json"
    path.write_text("{not json")
    result = subprocess.run([sys.executable, "manage.py", "clear_book", str(path)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert "not valid JSON" in result.stderr


def test_the_command_prints_the_clearing_on_stdout_only(tmp_path):
    result = clear_book(tmp_path, BOOK, "--time-limit", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["markets"][0]["gpu_model"] == "H100"


def test_a_book_cleared_without_a_proof_says_optimal_false(tmp_path, monkeypatch):
    import market.core.winners as winners

    monkeypatch.setattr(winners, "MIP_MAX_COLUMNS", 0)  # as if the book were too big
    path = tmp_path / "book.json"
    path.write_text(json.dumps(BOOK))
    out = StringIO()
    call_command("clear_book", str(path), "--time-limit", "1", stdout=out)
    for market in json.loads(out.getvalue())["markets"]:
        assert market["optimal"] is False
        assert Decimal(market["welfare_bound"]) >= Decimal(market["welfare"])


def test_runtimes_and_slices_in_a_book_are_honoured(tmp_path):
    book = {
        "levels": ["spine", "leaf", "node"],
        "nodes": [
            {"name": "slurm", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l0"},
             "reserve_prices": ["1.00"] * 4, "runtime": "slurm"},
            {"name": "plain", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l0"},
             "reserve_prices": ["2.00"] * 4, "runtime": "process"},
            {"name": "half", "gpu_model": "H100", "labels": {"spine": "s0", "leaf": "l1"},
             "reserve_prices": ["1.50"] * 2},
        ],
        "bids": [
            {"id": "no-slurm", "gpus": 4, "hours": "2", "max_price_per_gpu_hour": "3.00",
             "runtimes": ["none", "process", "ssh"]},
            {"id": "whole-nodes", "gpus": 4, "hours": "1", "max_price_per_gpu_hour": "3.00",
             "topology": {"slice": {"size": 4}}},
        ],
    }
    path = tmp_path / "book.json"
    path.write_text(json.dumps(book))
    out = StringIO()
    call_command("clear_book", str(path), stdout=out)
    market = json.loads(out.getvalue())["markets"][0]
    assignments = {a["id"]: a["assignment"] for a in market["accepted"]}
    # off the Slurm node, on the cheapest GPUs it may use; the slices take the whole node
    assert assignments == {"no-slurm": {"half": 2, "plain": 2}, "whole-nodes": {"slurm": 4}}

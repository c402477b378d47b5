"""`python -m scheduler.clearing` end to end, through a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

AUCTION = {
    "levels": ["spine", "leaf", "node"],
    "nodes": [
        {"name": "n1", "labels": {"spine": "s1", "leaf": "l1"}, "free_gpus": 4,
         "gpu_model": "H100", "reserve_price": "1.00"},
        {"name": "n2", "labels": {"spine": "s1", "leaf": "l1"}, "free_gpus": 4,
         "gpu_model": "H100", "reserve_prices": ["1.00", "1.50", "2.00", "3.00"]},
        {"name": "n3", "labels": {"spine": "s1", "leaf": "l2"}, "free_gpus": 8,
         "gpu_model": "H100", "reserve_price": "1.20"},
    ],
    "bids": [
        {"id": "a", "gpus": 8, "hours": 2, "max_price_per_gpu_hour": "2.50",
         "gpu_models": ["H100"], "topology": {"required": "leaf"}},
        {"id": "b", "gpus": 8, "hours": 1, "max_price_per_gpu_hour": "2.40",
         "topology": {"required": "leaf"}},
        {"id": "c", "gpus": 4, "hours": "1.5", "max_price_per_gpu_hour": "2.00",
         "submitted_at": "2026-11-30T01:00:00Z"},
        {"id": 7, "gpus": 2, "hours": 1, "max_price_per_gpu_hour": "1.10"},
    ],
}


def run(document):
    stdin = document if isinstance(document, str) else json.dumps(document)
    return subprocess.run(
        [sys.executable, "-m", "scheduler.clearing"],
        input=stdin, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )


def with_changes(document, **changes):
    changed = json.loads(json.dumps(document))
    for dotted, value in changes.items():
        target = changed
        *parents, last = dotted.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    return changed


def test_an_auction_clears_to_json_with_prices_as_decimal_strings():
    done = run(AUCTION)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert json.loads(done.stdout) == {
        "mode": "auction",
        "markets": [{
            "gpu_model": "H100",
            "clearing_price": "2.40",
            "gpus_sold": 12,
            "welfare": "26.80",
            "accepted": [
                {"id": "a", "gpus": 8, "hours": "2", "assignment": {"n3": 8},
                 "price_per_gpu_hour": "2.40", "total": "38.40"},
                {"id": "c", "gpus": 4, "hours": "1.5", "assignment": {"n1": 4},
                 "price_per_gpu_hour": "2.00", "total": "12.00"},
            ],
            "refused": [
                {"id": "b", "reason": "only 7 of 8 GPUs fit within one leaf; "
                                      "1 GPU more is priced above the limit of 2.40"},
                {"id": "7", "reason": "only 1 of 2 GPUs fit; 3 GPUs more are priced above the "
                                      "limit of 1.10"},
            ],
            "exact": {"welfare": "26.80", "greedy_welfare": "26.80", "gap": "0.000000",
                      "optimal": True},
        }],
        "refused": [],
    }


def test_on_demand_matches_at_posted_prices_with_a_breakdown():
    done = run(with_changes(AUCTION, mode="on_demand"))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["mode"] == "on_demand"
    first = answer["matched"][0]  # "c" was submitted at a known time, so it goes first
    assert first == {
        "id": "c", "gpus": 4, "hours": "1.5", "assignment": {"n1": 4},
        "gpus_by_price": [{"node": "n1", "price_per_gpu_hour": "1.00", "gpus": 4}],
        "cost_per_hour": "4.00", "total": "6.00",
    }
    assert {refusal["id"] for refusal in answer["refused"]} == {"b", "7"}


def test_a_bid_with_runtimes_takes_only_nodes_whose_runtime_is_one_of_them():
    # "c" alone, asking for a runtime only n3 reports: it skips the cheaper n1 and n2
    document = with_changes(AUCTION, mode="on_demand", nodes__2__runtime="process",
                            bids__2__runtimes=["process", "ssh"])
    document["bids"] = [document["bids"][2]]
    done = run(document)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["matched"][0]["assignment"] == {"n3": 4}


def test_a_bid_without_runtimes_may_take_a_slurm_node_as_a_what_if_takes_any_node():
    # the what-if states a bid's runtimes itself: absent, any node, a Slurm one included
    document = with_changes(AUCTION, mode="on_demand", nodes__0__runtime="slurm")
    document["bids"] = [document["bids"][2]]  # "c": 4 GPUs, cheapest on n1
    done = run(document)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["matched"][0]["assignment"] == {"n1": 4}

    # a market order naming no Slurm account is kept off Slurm nodes: say so with runtimes
    document["bids"][0]["runtimes"] = ["none", "process", "ssh"]
    done = run(document)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["matched"][0]["assignment"] == {"n3": 4}


def test_the_exact_solve_can_be_switched_off():
    done = run(with_changes(AUCTION, exact=False))
    assert json.loads(done.stdout)["markets"][0]["exact"] is None


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"levels": "spine"}, "levels"),
        ({"nodes__0__reserve_price": 2.0}, "nodes[0].reserve_price"),
        ({"nodes__1__reserve_prices": ["1.00"]}, "nodes[1].reserve_prices"),
        ({"nodes__0__labels": {"spine": "s1"}}, "nodes[0].labels.leaf"),
        ({"nodes__2__free_gpus": -1}, "nodes[2].free_gpus"),
        ({"nodes__2__colour": "red"}, "nodes[2].colour"),
        ({"bids__0__max_price_per_gpu_hour": "2.1234567"}, "bids[0].max_price_per_gpu_hour"),
        ({"bids__0__max_price_per_gpu_hour": "cheap"}, "bids[0].max_price_per_gpu_hour"),
        ({"bids__1__gpus": 0}, "bids[1].gpus"),
        ({"bids__1__hours": 0}, "bids[1].hours"),
        ({"bids__1__topology": {"required": "rack"}}, "bids[1].topology.required"),
        ({"bids__1__topology": {"required": "leaf", "slice": {"size": 3}}},
         "bids[1].topology.slice.size"),
        ({"bids__2__submitted_at": "yesterday"}, "bids[2].submitted_at"),
        ({"bids__3__id": "a"}, "bids[3].id"),
        ({"nodes__0__runtime": "docker"}, "nodes[0].runtime"),
        ({"bids__0__runtimes": ["process", "k8s"]}, "bids[0].runtimes[1]"),
        ({"mode": "haggle"}, "mode"),
        ({"extra": 1}, "extra"),
    ],
)
def test_malformed_input_exits_2_naming_the_field(changes, field):
    done = run(with_changes(AUCTION, **changes))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), done.stderr


def test_input_that_is_not_json_exits_2():
    done = run("{not json")
    assert done.returncode == 2
    assert done.stderr.startswith("error: input: not valid JSON")


def test_arguments_are_refused_with_the_usage():
    done = subprocess.run([sys.executable, "-m", "scheduler.clearing", "auction"], input="{}",
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m scheduler.clearing")

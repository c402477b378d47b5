"""`python -m scheduler.placement gang|mig` end to end, through a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

ISSUE_GANG = {
    "levels": ["spine", "leaf", "node"],
    "nodes": [
        {"name": "n1", "labels": {"spine": "s1", "leaf": "l1"}, "free_gpus": 8,
         "gpu_model": "H100-80GB"},
        {"name": "n2", "labels": {"spine": "s1", "leaf": "l1"}, "free_gpus": 8,
         "gpu_model": "H100-80GB"},
        {"name": "n3", "labels": {"spine": "s1", "leaf": "l2"}, "free_gpus": 8,
         "gpu_model": "H100-80GB"},
    ],
    "request": {"gpus": 16, "required": "leaf", "preferred": None,
                "slice": {"size": 8, "level": "node"}, "gpu_models": ["H100-80GB"]},
    "profile": "best_fit",
}


def run(command, document):
    stdin = document if isinstance(document, str) else json.dumps(document)
    return subprocess.run(
        [sys.executable, "-m", "scheduler.placement", command],
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


def test_gang_places_the_issue_example():
    done = run("gang", ISSUE_GANG)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "placed": True,
        "assignment": {"n1": 8, "n2": 8},
        "domains": {"spine": ["s1"], "leaf": ["l1"], "node": ["n1", "n2"]},
        "max_hops": 2,
    }


def test_gang_that_cannot_be_placed_exits_0_with_the_reason():
    done = run("gang", with_changes(ISSUE_GANG, request__gpus=24))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "placed": False, "reason": "only 2 of 3 slices fit within one leaf"}


def test_gang_with_only_the_required_keys_and_other_level_names():
    document = {
        "levels": ["block", "rack"],
        "nodes": [{"name": "r1", "labels": {"block": "b1"}, "free_gpus": 4},
                  {"name": "r2", "labels": {"block": "b2"}, "free_gpus": 2}],
        "request": {"gpus": 5},
    }
    done = run("gang", document)
    # no block holds 5: the roomiest (b1) goes whole, the last GPU to the other
    assert json.loads(done.stdout) == {
        "placed": True, "assignment": {"r1": 4, "r2": 1},
        "domains": {"block": ["b1", "b2"], "rack": ["r1", "r2"]}, "max_hops": 4}


def test_gang_refusal_reports_filter_exclusions():
    document = with_changes(ISSUE_GANG, request__gpu_models=["A100-80GB"])
    assert json.loads(run("gang", document).stdout) == {
        "placed": False,
        "reason": "only 0 of 2 slices fit within one leaf; excluded: gpu model: 3",
        "excluded": {"gpu model": 3},
    }


def test_mig_places_the_issue_example():
    document = {"model": "A100-40GB", "occupied": [{"profile": "3g.20gb", "start": 4}],
                "request": ["2g.10gb", {"memory_mib": 5000}]}
    done = run("mig", document)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "placed": True,
        "instances": [{"profile": "2g.10gb", "start": 0}, {"profile": "1g.5gb", "start": 2}],
    }


def test_mig_that_does_not_fit_exits_0():
    document = {"model": "H200-141GB", "occupied": [{"profile": "1g.18gb", "start": 0}],
                "request": ["7g.141gb"]}
    done = run("mig", document)
    assert done.returncode == 0
    assert json.loads(done.stdout) == {
        "placed": False, "reason": "7g.141gb do not fit beside the occupied instances"}


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"request__required": "rack"}, "request.required"),
        ({"request__preferred": "rack"}, "request.preferred"),
        ({"request__slice": {"size": 8, "level": "pod"}}, "request.slice.level"),
        ({"request__slice": {"size": 0, "level": "node"}}, "request.slice.size"),
        ({"request__gpus": -4}, "request.gpus"),
        ({"request__gpus": "16"}, "request.gpus"),
        ({"request__requried": "leaf"}, "request.requried"),
        ({"nodes__1__free_gpus": -1}, "nodes[1].free_gpus"),
        ({"nodes__2__labels": {"spine": "s1"}}, "nodes[2].labels.leaf"),
        ({"nodes__0__state": "sleeping"}, "nodes[0].state"),
        ({"profile": "worst_fit"}, "profile"),
        ({"levels": "spine"}, "levels"),
    ],
)
def test_malformed_gang_input_exits_2_naming_the_field(changes, field):
    done = run("gang", with_changes(ISSUE_GANG, **changes))
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {field}: ")


@pytest.mark.parametrize(
    "document, field",
    [
        ({"model": "A100-40GB", "request": ["5g.25gb"]}, "request[0]"),
        ({"model": "V100", "request": []}, "model"),
        ({"model": "A100-40GB", "occupied": [{"profile": "3g.20gb", "start": 2}],
          "request": []}, "occupied[0].start"),
        ({"model": "A100-40GB", "occupied": [{"profile": "3g.20gb", "start": -4}],
          "request": []}, "occupied[0].start"),
        ({"model": "A100-40GB"}, "request"),
    ],
)
def test_malformed_mig_input_exits_2_naming_the_field(document, field):
    done = run("mig", document)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(f"error: {field}: ")


def test_not_json_or_no_command_exits_2():
    assert run("gang", "{not json").returncode == 2
    done = subprocess.run([sys.executable, "-m", "scheduler.placement"], input="{}",
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("usage:")

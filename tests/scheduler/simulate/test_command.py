"""The command as a whole: the JSON contract, determinism, and no Django."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.simulate.cli import main

ROOT = Path(__file__).resolve().parents[3]
CLUSTER = ("node,gpu_model,gpus,gpu_memory_mib,cpu_milli,memory_mib,leaf,spine\n"
           + "".join(f"n{i},A100,4,40960,64000,512000,,\n" for i in range(1, 5)))
JOBS = ("job,submit_s,duration_s,gpus,gpu_milli,gpu_model,cpu_milli,memory_mib,tenant\n"
        "a,0,10,4,,,,,t1\nb,0,5,2,,,,,t1\nc,1,2,8,,,,,t2\nd,2,4,1,500,,,,t2\ne,3,1,0,,,1000,,t3\n")


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "cluster.csv").write_text(CLUSTER)
    (tmp_path / "jobs.csv").write_text(JOBS)
    return tmp_path


def simulate(folder: Path, *extra: str) -> dict:
    out = folder / "result.json"
    argv = ["--cluster", str(folder / "cluster.csv"), "--workload", str(folder / "jobs.csv"),
            "--out", str(out), "--fabric", "fat-tree:radix=4", *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_replay_writes_every_metric_under_its_fixed_key(inputs):
    result = simulate(inputs, "--policy", "best_fit", "--mode", "replay", "--seed", "7")
    assert (result["mode"], result["policy"], result["seed"]) == ("replay", "best_fit", 7)
    assert 0 < result["utilization"] <= 1
    assert set(result["wait_s"]) == {"mean", "p50", "p95"}
    assert set(result["jct_s"]) == {"mean"}
    assert {"minimal_domain_share", "mean_leaves_multi_node"} <= set(result["locality"])
    assert result["fragmentation"]["series"]
    assert len(result["inputs"]["workload"]["sha256"]) == 64
    assert result["inputs"]["cluster"]["gpus"] == 16
    assert result["jobs"] == {"total": 5, "completed": 5, "refused": 0}


def test_fill_keys_the_allocation_ratio_by_the_fractions_as_written(inputs):
    result = simulate(inputs, "--policy", "first_fit", "--mode", "fill",
                      "--fill-to", "0.9,1.0,1.30")
    assert list(result["allocation_ratio"]) == ["0.9", "1.0", "1.30"]
    assert all(0 < ratio <= 1 for ratio in result["allocation_ratio"].values())


def test_the_same_seed_gives_the_same_result(inputs):
    first = simulate(inputs, "--policy", "random", "--mode", "fill", "--seed", "3")
    again = simulate(inputs, "--policy", "random", "--mode", "fill", "--seed", "3")
    assert first == again


def test_the_module_runs_without_django(inputs):
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]; "
            "sys.modules['django'] = None; "  # importing Django would fail
            "runpy.run_module('scheduler.simulate', run_name='__main__')")
    argv = ["--cluster", str(inputs / "cluster.csv"), "--workload", str(inputs / "jobs.csv"),
            "--policy", "best_fit", "--mode", "replay", "--out", str(inputs / "r.json")]
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads((inputs / "r.json").read_text())["jobs"]["completed"] == 5


def test_the_plot_is_a_png(inputs):
    simulate(inputs, "--policy", "best_fit", "--mode", "replay", "--plot",
             str(inputs / "replay.png"))
    simulate(inputs, "--policy", "best_fit", "--mode", "fill", "--plot", str(inputs / "fill.png"))
    for name in ("replay.png", "fill.png"):
        assert (inputs / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_scale_divides_submit_times_and_keeps_run_times(inputs):
    # two jobs that each take the whole cluster (16 GPUs) for 10 s, 100 s apart
    (inputs / "jobs.csv").write_text(JOBS.splitlines()[0] + "\na,0,10,16,,,,,t1\nb,100,10,16,,,,,t1\n")
    plain = simulate(inputs, "--policy", "best_fit", "--mode", "replay", "--locality", "relaxed")
    faster = simulate(inputs, "--policy", "best_fit", "--mode", "replay", "--locality", "relaxed",
                      "--time-scale", "20")
    assert (plain["time_scale"], faster["time_scale"]) == (1.0, 20.0)
    assert (plain["span_s"], plain["wait_s"]["mean"]) == (110, 0)
    # b now arrives at 5 s and waits for a to end at 10 s
    assert (faster["span_s"], faster["wait_s"]["mean"]) == (20, 2.5)


def test_time_scale_must_be_above_zero(inputs, capsys):
    argv = ["--cluster", str(inputs / "cluster.csv"), "--workload", str(inputs / "jobs.csv"),
            "--out", str(inputs / "r.json"), "--policy", "best_fit", "--mode", "replay",
            "--time-scale", "0"]
    assert main(argv) == 2
    assert "--time-scale must be above 0" in capsys.readouterr().err


def test_locality_counts_leaves_beyond_the_fewest_the_empty_cluster_allows(inputs):
    result = simulate(inputs, "--policy", "best_fit", "--mode", "replay")
    assert "mean_excess_leaves_multi_node" in result["locality"]

"""Replaying a workload under quotas (`--quotas`): tenants as quota holders, waiting time per
tenant with and without borrowing, and a bad QUOTAS.csv named by line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.simulate.cli import main

ROOT = Path(__file__).resolve().parents[3]

# 16 GPUs: 4 nodes of 4.
CLUSTER = ("node,gpu_model,gpus,gpu_memory_mib,cpu_milli,memory_mib,leaf,spine\n"
           + "".join(f"n{i},A100,4,40960,64000,512000,,\n" for i in range(1, 5)))
# Lab `busy` sends 12 GPUs of work at once; lab `idle` sends one late job.
JOBS = ("job,submit_s,duration_s,gpus,gpu_milli,gpu_model,cpu_milli,memory_mib,tenant\n"
        "a,0,100,4,,,,,busy\nb,0,100,4,,,,,busy\nc,0,100,4,,,,,busy\n"
        "d,50,10,4,,,,,idle\n")
QUOTAS = ("tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority\n"
          "busy,A100,4,,,0\nidle,A100,12,,,0\n")


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "cluster.csv").write_text(CLUSTER)
    (tmp_path / "jobs.csv").write_text(JOBS)
    (tmp_path / "quotas.csv").write_text(QUOTAS)
    return tmp_path


def replay(folder: Path, *extra: str) -> dict:
    out = folder / "result.json"
    assert main(["--cluster", str(folder / "cluster.csv"), "--workload",
                 str(folder / "jobs.csv"), "--policy", "best_fit", "--mode", "replay",
                 "--quotas", str(folder / "quotas.csv"), "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_with_borrowing_a_busy_tenant_uses_the_idle_tenants_gpus(inputs):
    result = replay(inputs)

    busy = result["tenants"]["busy"]
    assert result["borrowing"] is True
    assert busy["wait_s"]["mean"] == 0  # all three start at once, 8 GPUs borrowed
    assert busy["borrowed_gpu_s"] == 800
    assert result["tenants"]["idle"]["wait_s"]["mean"] == 0  # its 4 of 16 were free
    assert result["jobs"] == {"total": 4, "completed": 4, "refused": 0}


def test_without_borrowing_the_busy_tenant_waits_for_its_own_quota(inputs):
    result = replay(inputs, "--no-borrowing")

    busy = result["tenants"]["busy"]
    assert result["borrowing"] is False
    assert busy["wait_s"]["mean"] == 100  # one at a time: waits 0, 100 and 200 s
    assert busy["borrowed_gpu_s"] == 0
    assert result["inputs"]["quotas"]["tenants"] == 2


@pytest.mark.parametrize("quotas, message", [
    ("tenant,gpu_model,nominal,borrowing_limit,lending_limit\nbusy,A100,4,,\n",
     "quotas.csv:1: missing column priority"),
    (QUOTAS + "busy,A100,8,,,0\n", "quotas.csv:4: busy A100 is already on line 2"),
    ("tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority\nbusy,A100,-1,,,0\n",
     "quotas.csv:2: nominal must be at least 0"),
    ("tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority\nbusy,A100,4,,8,0\n",
     "quotas.csv:2: lending_limit 8 is above nominal 4"),
    ("tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority,colour\n"
     "busy,A100,4,,,0,red\n", "quotas.csv:1: unknown column colour"),
    ("tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority\nbusy,A100,4,,,0\n",
     "tenant 'idle' of the workload has no quota row"),
])
def test_a_bad_quotas_file_is_named_by_line(inputs, capsys, quotas, message):
    (inputs / "quotas.csv").write_text(quotas)

    status = main(["--cluster", str(inputs / "cluster.csv"), "--workload",
                   str(inputs / "jobs.csv"), "--policy", "best_fit", "--mode", "replay",
                   "--quotas", str(inputs / "quotas.csv"), "--out", str(inputs / "r.json")])

    assert status == 2
    assert message in capsys.readouterr().err


def test_make_quotas_splits_the_gpus_by_gpu_time(inputs):
    out = inputs / "made.csv"

    assert main(["make-quotas", "--workload", str(inputs / "jobs.csv"), "--gpus", "40",
                 "--gpu-model", "A100", "--out", str(out)]) == 0

    lines = out.read_text().splitlines()
    assert lines[0] == "tenant,gpu_model,nominal,borrowing_limit,lending_limit,priority"
    # 8 each, the other 24 by GPU-time: busy 1,200 GPU-s, idle 40
    assert lines[1:] == ["busy,A100,31,,,0", "idle,A100,9,,,0"]


def test_the_replay_under_quotas_runs_without_django(inputs):
    code = ("import sys, runpy; sys.argv = ['x'] + sys.argv[1:]; "
            "sys.modules['django'] = None; "  # importing Django would fail
            "runpy.run_module('scheduler.simulate', run_name='__main__')")
    argv = ["--cluster", str(inputs / "cluster.csv"), "--workload", str(inputs / "jobs.csv"),
            "--policy", "best_fit", "--mode", "replay", "--quotas", str(inputs / "quotas.csv"),
            "--out", str(inputs / "r.json")]
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert json.loads((inputs / "r.json").read_text())["jobs"]["completed"] == 4

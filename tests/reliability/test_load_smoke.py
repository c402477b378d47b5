"""A 20-second smoke of the load test (bench/load.py): gunicorn with 4 workers, 10 tenants,
against the test database; no request fails. The latency targets are judged on the 5-minute
run (`make load`, docs/reliability.md), not here, on a shared CI machine."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BASE_DIR, child_env

SECONDS = os.environ.get("IBEX_LOAD_SMOKE_SECONDS", "20")


@pytest.mark.django_db(transaction=True)
def test_a_short_load_run_serves_every_request(tmp_path):
    env = child_env()
    result = subprocess.run(
        [sys.executable, "bench/load.py", "--seconds", SECONDS, "--users", "10",
         "--database-url", env["DATABASE_URL"], "--json", str(tmp_path / "load.json")],
        cwd=BASE_DIR, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads((tmp_path / "load.json").read_text())
    print(figures)
    assert figures["errors"] == 0, figures["error_examples"]
    assert figures["groups"]["orders"]["requests"] > 0
    assert figures["groups"]["reads"]["requests"] > 10 * figures["groups"]["orders"]["requests"] / 4

"""PostgreSQL restarted under load (see pg_restart.py): the web side and the worker reconnect
by themselves, no acknowledged order is lost or stuck, and the invariants hold.

CI: 20 s of load with one restart; `make crash` runs 60 s with three restarts
(IBEX_PG_RESTART_SECONDS, IBEX_PG_RESTARTS).
"""

import json
import os
import subprocess
import sys

from tests.conftest import BASE_DIR

SECONDS = os.environ.get("IBEX_PG_RESTART_SECONDS", "20")
RESTARTS = os.environ.get("IBEX_PG_RESTARTS", "1")


def test_orders_survive_a_postgresql_restart_under_load():
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}  # its own PostgreSQL
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.pg_restart", "--seconds", SECONDS,
         "--restarts", RESTARTS], cwd=BASE_DIR, env=env, capture_output=True, text=True,
        timeout=600)

    assert result.returncode == 0, result.stderr[-4000:]
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    print(figures)  # pytest -s shows them (docs/reliability.md)
    assert len(figures["restarts"]) == int(RESTARTS)
    assert figures["orders_after_last_restart"] > 0  # the app reconnected by itself
    assert figures["acknowledged_orders_missing"] == 0  # nothing acknowledged was lost
    assert figures["acknowledged_orders_stuck"] == 0
    assert figures["holds_open_without_a_live_order"] == 0
    assert figures["orders_per_key_above_one"] == 0
    assert figures["leases_not_placed"] == 0
    assert figures["overlapping_allocations"] == 0
    assert figures["ledger_total_micros"] == 0

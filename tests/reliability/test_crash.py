"""A real Celery worker killed with SIGKILL at random moments of placement, clearing, metering
and payouts, restarted each time: every job finishes and the invariants hold (see crash.py).

CI runs IBEX_CRASH_LOOPS (default 3) kills of each; `make crash` runs 50.
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import BASE_DIR, child_env

LOOPS = int(os.environ.get("IBEX_CRASH_LOOPS", "3"))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("scenario", ["placement", "clearing", "metering", "payouts"])
def test_killed_workers_lose_nothing_and_break_no_invariant(scenario, tmp_path):
    from pool.services import ensure_gpu_catalogue

    ensure_gpu_catalogue()
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.crash", scenario, "--loops", str(LOOPS),
         "--log", str(tmp_path / "workers.log")],
        cwd=BASE_DIR, env=child_env(), capture_output=True, text=True, timeout=300 + 90 * LOOPS)

    log = tmp_path / "workers.log"
    assert result.returncode == 0, (result.stderr[-3000:]
                                    + (log.read_text()[-3000:] if log.exists() else ""))
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    print(figures)  # pytest -s shows them (docs/reliability.md)
    assert figures["kills"] == figures["recovered"] == LOOPS
    assert figures["overlapping_allocations"] == figures["stuck_leases"] == 0
    assert figures["ledger_total_micros"] == figures["stale_balances"] == 0
    assert figures["stripe_objects_made_twice"] == 0
    assert figures["payouts_without_one_transfer_and_one_bank_payout"] == 0
    if scenario == "payouts":
        assert figures["payouts"] >= 3 * LOOPS

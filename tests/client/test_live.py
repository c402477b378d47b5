"""`ibex` against the live API: the test server, a real Celery worker and two simulated node
agents. A tenant orders with `--wait` and gets an active lease that runs its command, reads
the lease and its logs, extends and terminates it, follows its events; every command's
`--json`, the exit codes, `--explain` lines that run as printed, the config file written by
`ibex login`, and the provider's commands."""

import json
import os
import stat
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from market.models import Lease, Order
from pool.models import Node
from tests.client.live import wait_for
from tests.client.test_client import LEASE_KEYS, ORDER_KEYS

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]

ORDER = ("--gpus", "16", "--model", "H100-80GB", "--within", "leaf", "--hours", "1",
         "--max-price", "2.00")
COMMAND = ("--env", "IBEX_SIMULATED_SECONDS=600", "--command", "--", "python3", "train.py",
           "--epochs", "3")


def test_a_tenant_orders_waits_for_the_lease_reads_its_logs_extends_and_ends_it(exchange):
    placed = exchange.ibex("order", *ORDER, "--wait", "--timeout", "90", "--json", *COMMAND)

    assert placed.code == 0, placed.err
    assert set(placed.json) == {"order", "lease"}
    order, lease = placed.json["order"], placed.json["lease"]
    assert set(order) == ORDER_KEYS and set(lease) == LEASE_KEYS
    assert order["state"] == "filled" and order["lease"] == lease["id"]
    assert lease["state"] == "active" and exchange.lease_state(lease["id"]) == "active"
    assert lease["locality"] == {"leaves": 1, "spines": 1, "max_hops": 2}
    assert len(lease["gpus"]) == 16
    assert f"idempotency key: {order['idempotency_key']}" in placed.err
    assert Order.objects.get(pk=order["id"]).idempotency_key == order["idempotency_key"]
    lease_id = str(lease["id"])

    # the same command again, with the printed key: the same order, nothing new
    again = exchange.ibex("order", *ORDER, "--json", "--idempotency-key",
                          order["idempotency_key"], *COMMAND)
    assert again.code == 0, again.err
    assert again.json["order"]["id"] == order["id"] and Order.objects.count() == 1

    shown = wait_for(lambda: (r := exchange.ibex("lease", lease_id, "--json")).json[
        "workload"]["state"] == "running" and r, "the command to run")
    assert set(shown.json) == LEASE_KEYS
    assert shown.json["workload"]["command"] == ["python3", "train.py", "--epochs", "3"]
    assert [r["node_rank"] for r in shown.json["workload"]["nodes"]] == [0, 1]
    assert shown.json["sla"]["tier"] == "on_demand"
    assert shown.json["price_per_gpu_hour"] == "2.00"
    people = exchange.ibex("lease", lease_id)
    assert people.code == 0
    assert f"lease {lease_id}  active  on_demand  16 × H100-80GB" in people.out
    assert "locality  1 leaf, 1 spine, at most 2 hops" in people.out
    assert "rank 1 on hpc-provider-02: running" in people.out

    logs = wait_for(lambda: len((r := exchange.ibex("logs", lease_id, "--node-rank", "1",
                                                    "--json")).json_lines) and r,
                    "the rank's output")
    assert logs.code == 0
    page = logs.json_lines[0]
    assert set(page) == {"node_rank", "node", "lines", "cursor", "dropped", "more"}
    assert page["node"] == "hpc-provider-02"
    assert page["lines"][0].startswith("simulated: rank 1 of 2 on hpc-provider-02")
    plain = exchange.ibex("logs", lease_id, "--node-rank", "1")
    assert plain.out.splitlines()[:1] == page["lines"][:1]
    after = exchange.ibex("logs", lease_id, "--node-rank", "1", "--since", page["cursor"],
                          "--json")
    assert after.code == 0 and all(p["lines"] != page["lines"] for p in after.json_lines)

    ends_at = Lease.objects.get(pk=lease["id"]).ends_at
    extended = exchange.ibex("extend", lease_id, "--hours", "2", "--json")
    assert extended.code == 0, extended.err
    assert set(extended.json) == LEASE_KEYS
    assert (Lease.objects.get(pk=lease["id"]).ends_at - ends_at).total_seconds() == 7200

    balance = exchange.ibex("balance", "--json")
    assert balance.code == 0
    assert set(balance.json) == {"organization", "currency", "available", "held", "payable",
                                 "held_back", "spend_limit_per_hour", "spend_limit_per_month"}
    assert balance.json["organization"] == "acme-ai"
    assert Decimal(balance.json["available"]) + Decimal(balance.json["held"]) <= Decimal(200)

    listed = exchange.ibex("leases", "--json")
    assert [x["id"] for x in listed.json] == [lease["id"]]
    assert [o["id"] for o in exchange.ibex("orders", "--json").json] == [order["id"]]
    assert "active" in exchange.ibex("leases").out

    exchange.beat()
    following = exchange.popen("events", "--follow", "--json", "--lease", lease_id)
    try:
        ended = exchange.ibex("terminate", lease_id, "--json")
        assert ended.code == 0, ended.err
        assert set(ended.json) == LEASE_KEYS and ended.json["state"] == "terminated"
        exchange.beat()
        first = json.loads(following.stdout.readline())  # lease.started, then lease.ended
        second = json.loads(following.stdout.readline())
    finally:
        following.terminate()
        following.wait(timeout=10)
    assert set(first) == {"id", "kind", "lease", "payload", "occurred_at", "created_at"}
    assert [first["kind"], second["kind"]] == ["lease.started", "lease.ended"]
    listed = exchange.ibex("events", "--json")
    assert [e["kind"] for e in listed.json] == ["lease.ended", "lease.started"]

    # the lease has ended: --follow reads what is left and stops
    followed = exchange.ibex("logs", lease_id, "--follow", timeout=60)
    assert followed.code == 0
    assert followed.out.splitlines()[0].startswith("simulated: rank 0 of 2")


def test_exit_codes_are_0_done_1_refused_2_bad_usage(exchange):
    refused = exchange.ibex("order", "--gpus", "64", "--model", "H100-80GB", "--within", "leaf",
                            "--hours", "1", "--max-price", "2.00")
    assert refused.code == 1
    assert refused.err.splitlines()[-1].startswith("ibex: gpus: ")  # more than the fabric has

    too_low = exchange.ibex("order", "--gpus", "8", "--model", "H100-80GB", "--hours", "1",
                            "--max-price", "1.00", "--json")
    assert too_low.code == 1
    assert "refused" in too_low.err.splitlines()[-1]

    unknown_model = exchange.ibex("order", "--gpus", "8", "--model", "Z9000", "--hours", "1",
                                  "--max-price", "2", "--json")
    assert unknown_model.code == 1
    assert unknown_model.json["error"]["field"] == "gpu_models"
    assert unknown_model.err.strip() .endswith("ibex: gpu_models: unknown GPU model 'Z9000'")

    nobody = exchange.ibex("extend", "999999", "--hours", "1")
    assert nobody.code == 1 and nobody.err.startswith("ibex: ")

    card = exchange.ibex("top-up", "50")
    assert card.code == 1 and "card" in card.err.lower()

    bad_key = exchange.ibex("balance", key="ibex_000000000000_nope")
    assert bad_key.code == 1

    assert exchange.ibex("order", "--gpus", "8", "--hours", "1").code == 2
    assert exchange.ibex("extend", "1").code == 2
    assert exchange.ibex("balance").code == 0

    spot = exchange.ibex("bid", "--gpus", "8", "--model", "H100-80GB", "--hours", "1",
                         "--max-price", "1.50", "--json")
    assert spot.code == 0, spot.err
    assert spot.json["order"]["state"] == "resting"
    cancelled = exchange.ibex("cancel", str(spot.json["order"]["id"]), "--json")
    assert cancelled.code == 0 and cancelled.json["state"] == "cancelled"
    assert exchange.ibex("cancel", str(spot.json["order"]["id"])).code == 1


def test_explain_prints_curl_lines_that_give_the_same_json(exchange):
    explained = exchange.ibex("balance", "--json", "--explain")

    assert explained.code == 0
    assert exchange.tenant_key not in explained.err
    curl = [line for line in explained.err.splitlines() if line.startswith("curl ")]
    assert len(curl) == 1 and "$IBEX_API_KEY" in curl[0]
    ran = subprocess.run(["bash", "-c", curl[0]], capture_output=True, text=True, timeout=30,
                         env=exchange.env())
    answer = json.loads(ran.stdout)
    assert {k: answer[k] for k in explained.json} == explained.json

    bid = exchange.ibex("bid", "--gpus", "8", "--model", "H100-80GB", "--hours", "1",
                        "--max-price", "1.50", "--explain")
    line = next(x for x in bid.err.splitlines() if x.startswith("curl -sS -X POST"))
    replayed = json.loads(subprocess.run(["bash", "-c", line], capture_output=True, text=True,
                                         timeout=30, env=exchange.env()).stdout)
    assert replayed["state"] == "resting"  # the same Idempotency-Key: the same order
    assert Order.objects.count() == 1 and replayed["id"] == Order.objects.get().id


def test_login_writes_a_private_config_that_later_commands_use(exchange):
    env = exchange.env()
    logged = exchange.ibex("login", "--api", exchange.url, "--profile", "lab", "--json",
                           env=env)
    assert logged.code == 0, logged.err
    assert set(logged.json) == {"profile", "api", "config", "username", "organizations",
                                "scopes"}
    path = Path(logged.json["config"])
    assert path == exchange.home / ".config" / "ibex" / "config.toml"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    bare = {k: v for k, v in env.items() if not k.startswith("IBEX_")}
    used = exchange.ibex("balance", "--profile", "lab", "--json", env=bare)
    assert used.code == 0, used.err
    assert used.json["organization"] == "acme-ai"
    assert exchange.ibex("balance", env=bare).code == 1  # profile default: none stored

    script = Path(sys.executable).parent / "ibex"  # the installed command
    installed = subprocess.run([str(script), "balance", "--profile", "lab", "--json"],
                               env=bare, capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    assert json.loads(installed.stdout) == used.json


def test_a_provider_lists_prices_and_drains_its_nodes_and_reads_its_earnings(exchange):
    key = exchange.provider_key

    nodes = exchange.ibex("provider", "nodes", "--json", key=key)
    assert nodes.code == 0, nodes.err
    assert [n["hostname"] for n in nodes.json] == ["hpc-provider-01", "hpc-provider-02"] or \
        sorted(n["hostname"] for n in nodes.json) == ["hpc-provider-01", "hpc-provider-02"]
    assert set(nodes.json[0]) == {"id", "hostname", "fabric", "gpu_model", "state",
                                  "drain_mode", "health", "gpus", "last_heartbeat_at"}

    priced = exchange.ibex("provider", "price", "--fabric", "lab", "--model", "H100-80GB",
                           "--price", "2.40", "--json", key=key)
    assert priced.code == 0, priced.err
    assert priced.json == {"gpus_priced": 16, "price_per_gpu_hour": "2.40"}

    drained = exchange.ibex("provider", "drain", "hpc-provider-02", "--mode", "run_to_end",
                            "--json", key=key)
    assert drained.code == 0, drained.err
    assert drained.json["hostname"] == "hpc-provider-02"
    assert drained.json["drain_mode"] == "run_to_end"
    assert Node.objects.get(hostname="hpc-provider-02").drain_mode == "run_to_end"

    earnings = exchange.ibex("provider", "earnings", "--json", key=key)
    assert earnings.code == 0, earnings.err
    assert set(earnings.json) == {"currency", "payable", "held_back", "months"}

    tenant_cannot = exchange.ibex("provider", "price", "--fabric", "lab", "--price", "1")
    assert tenant_cannot.code == 1

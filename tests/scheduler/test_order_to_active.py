"""End to end with real parts: the API over HTTP, a real Celery worker process, and the real
`ibex-agent simulate` acknowledging the lease through its heartbeats."""

import subprocess
import sys
import time

import pytest
import requests

from billing import services as money
from ibex.accounts import services as accounts
from market import prices
from market.models import Lease
from pool.models import Node
from scheduler import placing as scheduler
from tests.market.inventory import provider_with_nodes

DEADLINE_S = 60


def wait_for(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_an_order_becomes_an_active_lease_once_the_agents_serve_it(
        live_server, celery_worker_process, settings):
    settings.NODE_HEARTBEAT_INTERVAL_S = 1
    provider = provider_with_nodes(nodes=2)  # registers the nodes (interval 1 s)
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",))
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=["read", "trade"])
    agents = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--api", live_server.url,
         "--key", provider_key.raw_key, "--fabric", "lab", "--hosts", "hpc-provider-[01-02]",
         "--gpu-model", "H100-80GB", "--gpus", "8", "--duration", "50", "--quiet"])
    try:
        wait_for(lambda: Node.objects.filter(state="active").count() == 2, "the nodes")
        answer = requests.post(f"{live_server.url}/api/v1/orders/", json={
            "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", "topology": {"required": "leaf"}},
            headers={"Authorization": f"Bearer {tenant_key.raw_key}"}, timeout=30).json()
        lease_id = answer["lease"]

        def active():
            scheduler.activate_acknowledged_leases()  # what beat runs every 5 s
            return Lease.objects.get(pk=lease_id).state == "active"

        wait_for(active, "the lease to become active")
    finally:
        agents.terminate()
        agents.wait(timeout=30)

    lease = Lease.objects.get(pk=lease_id)
    assert answer["state"] == "filled"
    assert [e.to_state for e in lease.events.all()] == ["pending", "placing", "active"]
    assert lease.locality == {"leaves": 1, "spines": 1, "max_hops": 2}

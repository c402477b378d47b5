"""A private-pool order end to end with real parts: the API over HTTP, a real Celery worker
that runs the admission pass and binds the lease, and `ibex-agent simulate` serving it."""

import subprocess
import sys

import pytest
import requests

from ibex.accounts import services as accounts
from market.models import Lease, Order
from pool.models import Node
from scheduler import placing as scheduler
from tests.scheduler.pools.builders import private_pool, queue
from tests.scheduler.test_order_to_active import wait_for


@pytest.mark.django_db(transaction=True)
def test_a_pool_order_is_admitted_by_the_worker_and_becomes_an_active_lease(
        live_server, celery_worker_process, settings):
    settings.NODE_HEARTBEAT_INTERVAL_S = 1
    pool = private_pool(nodes=2, slug="hpc-provider")
    Node.objects.update(state="registering")  # the agents' heartbeats bring them up
    lab = accounts.create_organization(slug="physics-lab", roles=("tenant",))
    queue(pool, "physics", lab, nominal=16)
    provider_key = accounts.issue_api_key(organization=Node.objects.first().provider,
                                          scopes=["read", "provide"])
    lab_key = accounts.issue_api_key(organization=lab, scopes=["read", "trade"])
    agents = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--api", live_server.url,
         "--key", provider_key.raw_key, "--fabric", "lab", "--hosts", "hpc-provider-[01-02]",
         "--gpu-model", "H100-80GB", "--gpus", "8", "--duration", "50", "--quiet"])
    try:
        wait_for(lambda: Node.objects.filter(state="active").count() == 2, "the nodes")
        answer = requests.post(f"{live_server.url}/api/v1/orders/", json={
            "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "0.00", "pool": pool.name,
            "topology": {"required": "leaf"}},
            headers={"Authorization": f"Bearer {lab_key.raw_key}"}, timeout=30).json()
        wait_for(lambda: Order.objects.get(pk=answer["id"]).state == "filled",
                 "the worker's admission pass")
        lease_id = Order.objects.get(pk=answer["id"]).lease_id

        def active():
            scheduler.activate_acknowledged_leases()  # what beat runs every 5 s
            return Lease.objects.get(pk=lease_id).state == "active"

        wait_for(active, "the lease to become active")
    finally:
        agents.terminate()
        agents.wait(timeout=30)

    lease = Lease.objects.get(pk=lease_id)
    assert answer["state"] == "queued"
    assert [e.to_state for e in lease.events.all()] == ["pending", "placing", "active"]
    assert (lease.quota_node.name, lease.price_micros, lease.gpu_count) == ("physics", 0, 16)

"""Parts of GPUs end to end with real parts: the API over HTTP, a real Celery worker, and the
real `ibex-agent simulate` making the slices and shares and reporting them."""

import subprocess
import sys

import pytest
import requests

from billing import services as money
from ibex.accounts import services as accounts
from market import prices
from market.models import Lease
from pool.models import Node
from scheduler import placing as scheduler
from tests.market.inventory import provider_with_nodes
from tests.scheduler.test_order_to_active import wait_for


@pytest.mark.django_db(transaction=True)
def test_a_slice_and_two_tenants_shares_become_active_and_show_what_the_agents_made(
        live_server, celery_worker_process, settings):
    settings.NODE_HEARTBEAT_INTERVAL_S = 1
    provider = provider_with_nodes(nodes=1)
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_800_000,
                      actor="test", shareable=True)
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    keys = []
    for slug in ("acme-ai", "beta-labs"):
        tenant = accounts.create_organization(slug=slug, roles=("tenant",))
        money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t",
                           actor="t")
        keys.append(accounts.issue_api_key(organization=tenant, scopes=["read", "trade"]))
    agents = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--api", live_server.url,
         "--key", provider_key.raw_key, "--fabric", "lab", "--hosts", "hpc-provider-01",
         "--gpu-model", "H100-80GB", "--gpus", "8", "--duration", "50", "--quiet"])

    def order(key, **product):
        return requests.post(f"{live_server.url}/api/v1/orders/", json={
            "gpu_models": ["H100-80GB"], "count": 1, "hours": 1, "tier": "on_demand",
            "max_price_per_gpu_hour": "2.00", **product},
            headers={"Authorization": f"Bearer {key.raw_key}"}, timeout=30).json()

    def lease_json(key, lease_id):
        return requests.get(f"{live_server.url}/api/v1/leases/{lease_id}/", timeout=30,
                            headers={"Authorization": f"Bearer {key.raw_key}"}).json()

    try:
        wait_for(lambda: Node.objects.filter(state="active").count() == 1, "the node")
        ordered = [(keys[0], order(keys[0], mig_profile="3g.40gb")),
                   (keys[0], order(keys[0], gpu_share=500)),
                   (keys[1], order(keys[1], gpu_share=500))]
        ids = [body["lease"] for _, body in ordered]

        def active_and_reported():
            scheduler.activate_acknowledged_leases()
            return all(Lease.objects.get(pk=i).state == "active" for i in ids) and all(
                lease_json(key, body["lease"])["gpus"][0]["enforced"] is not None
                for key, body in ordered)

        wait_for(active_and_reported, "the leases to be active and their parts reported")
        shown = [lease_json(key, body["lease"]) for key, body in ordered]
    finally:
        agents.terminate()
        agents.wait(timeout=30)

    [slice_] = shown[0]["gpus"]
    assert (slice_["mig_profile"], slice_["enforced"]) == ("3g.40gb", True)
    assert slice_["device"].startswith("MIG-")
    shares = [lease["gpus"][0] for lease in shown[1:]]
    assert [s["share"] for s in shares] == [500, 500] and all(s["enforced"] for s in shares)
    assert shares[0]["index"] == shares[1]["index"] != slice_["index"]  # two tenants, one GPU

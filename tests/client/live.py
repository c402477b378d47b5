"""An exchange to run `ibex` against: the live test server, a real Celery worker, a provider
whose two nodes are `ibex-agent simulate` (runtime process, so leases run commands), a funded
tenant with an API key; and `ibex` itself run as a separate process, as people run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from billing import services as money
from ibex.accounts import services as accounts
from market import prices
from market.models import Lease
from notify import events
from pool.models import Node
from scheduler import placing
from tests.market.inventory import provider_with_nodes

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60
HOSTS = "hpc-provider-[01-02]"


def wait_for(check, what: str, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
    return found


@dataclass
class Ran:
    code: int
    out: str
    err: str

    @property
    def json(self):
        return json.loads(self.out)

    @property
    def json_lines(self) -> list:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]


@dataclass
class Exchange:
    url: str
    tenant_key: str
    provider_key: str
    home: Path
    provider: object
    tenant: object

    def env(self, key: str | None = None, **extra: str) -> dict[str, str]:
        """A shell's environment for `ibex`: only PATH and a home of its own, then the API."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "XDG_CONFIG_HOME": str(self.home / ".config"), "LANG": "C.UTF-8",
               "IBEX_API": self.url, "IBEX_API_KEY": key or self.tenant_key}
        return {**env, **extra}

    def ibex(self, *args: str, key: str | None = None, env: dict | None = None,
             timeout: float = 120) -> Ran:
        done = subprocess.run([sys.executable, "-m", "ibex_client", *args], cwd=ROOT,
                              env=env or self.env(key), capture_output=True, text=True,
                              timeout=timeout)
        return Ran(done.returncode, done.stdout, done.stderr)

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "ibex_client", *args], cwd=ROOT,
                                env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def beat(self) -> None:
        """What Celery beat would run now: activation's safety net, tenant events."""
        placing.activate_acknowledged_leases()
        events.sync_events()

    def lease_state(self, lease_id: int) -> str:
        return Lease.objects.get(pk=lease_id).state


@pytest.fixture
def exchange(live_server, celery_worker_process, settings, tmp_path):
    settings.NODE_HEARTBEAT_INTERVAL_S = 1
    provider = provider_with_nodes(nodes=2)
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    provider_key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"])
    tenant = accounts.create_organization(slug="acme-ai", roles=("tenant",))
    money.grant_credit(organization=tenant, amount_micros=200_000_000, reason="t", actor="t")
    tenant_key = accounts.issue_api_key(organization=tenant, scopes=["read", "trade"])
    agents = subprocess.Popen(
        [sys.executable, "-m", "agent", "simulate", "--api", live_server.url,
         "--key", provider_key.raw_key, "--fabric", "lab", "--hosts", HOSTS,
         "--gpu-model", "H100-80GB", "--gpus", "8", "--duration", "170", "--quiet"], cwd=ROOT)
    try:
        wait_for(lambda: Node.objects.filter(state="active").count() == 2, "the nodes")
        home = tmp_path / "home"
        home.mkdir()
        yield Exchange(url=live_server.url, tenant_key=tenant_key.raw_key,
                       provider_key=provider_key.raw_key, home=home, provider=provider,
                       tenant=tenant)
    finally:
        agents.terminate()
        agents.wait(timeout=30)

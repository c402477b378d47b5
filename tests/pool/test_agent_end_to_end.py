"""The real `ibex-agent simulate` process against the real API served over HTTP."""

import json
import subprocess
import sys

import pytest

from fabric import services as fabric_services
from fabric.core import generators
from ibex.accounts import services as accounts
from pool.models import Gpu, HealthEvent, Node
from pool.services import ensure_gpu_catalogue


@pytest.mark.django_db(transaction=True)
def test_simulated_agents_register_activate_and_report_failures(live_server, tmp_path, settings):
    settings.NODE_HEARTBEAT_INTERVAL_S = 1
    ensure_gpu_catalogue()  # a transactional test starts from a flushed database
    provider = accounts.create_organization(slug="hpc-provider", roles=("provider",))
    key = accounts.issue_api_key(organization=provider, scopes=["read", "provide"]).raw_key
    fabric_services.save_fabric(owner=provider, name="lab", spec=generators.fat_tree(8, 8),
                                source="generator")
    control = tmp_path / "control.json"
    control.write_text(json.dumps({"fail_gpus": {"node02": [3]},
                                   "stop_heartbeats": ["node08"]}))

    result = subprocess.run(
        [sys.executable, "-m", "agent", "simulate", "--api", live_server.url, "--key", key,
         "--fabric", "lab", "--hosts", "node[01-08]", "--gpu-model", "H100-80GB", "--gpus", "8",
         "--duration", "8", "--control", str(control), "--quiet"],
        capture_output=True, text=True, timeout=60,
    )

    assert result.returncode == 0, result.stderr
    states = dict(Node.objects.values_list("hostname", "state"))
    assert len(states) == 8
    assert states.pop("node08") == "registering"  # its heartbeats were stopped
    assert set(states.values()) == {"active"}
    failed = Gpu.objects.get(node__hostname="node02", index=3)
    assert failed.health == "failed"
    assert HealthEvent.objects.filter(gpu=failed, to_value="failed").exists()
    assert Gpu.objects.exclude(pk=failed.pk).filter(health="ok").count() == 55
    # node08 never beat: its GPUs are not known to be healthy, so not offered
    assert set(Gpu.objects.filter(node__hostname="node08").values_list("health", flat=True)) == {
        "unknown"}

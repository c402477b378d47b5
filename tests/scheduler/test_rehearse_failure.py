import json

import pytest
from django.core.management import CommandError, call_command

from tests.market.inventory import provider_with_nodes


def test_it_writes_the_failure_into_the_providers_control_file(db, tmp_path, monkeypatch):
    monkeypatch.setenv("IBEX_VAR_DIR", str(tmp_path))
    (tmp_path / "demo").mkdir()
    provider_with_nodes(nodes=2)

    call_command("rehearse_failure", "--host", "hpc-provider-01", "--gpu", "2")
    call_command("rehearse_failure", "--host", "hpc-provider-02", "--node-down")

    control = json.loads((tmp_path / "demo" / "hpc-provider-control.json").read_text())
    assert control == {"fail_gpus": {"hpc-provider-01": [2]},
                       "stop_heartbeats": ["hpc-provider-02"]}
    call_command("rehearse_failure", "--clear")
    assert json.loads((tmp_path / "demo" / "hpc-provider-control.json").read_text()) == {}


def test_it_refuses_an_unknown_host_or_gpu(db, tmp_path, monkeypatch):
    monkeypatch.setenv("IBEX_VAR_DIR", str(tmp_path))
    (tmp_path / "demo").mkdir()
    provider_with_nodes(nodes=2)

    with pytest.raises(CommandError, match="no node"):
        call_command("rehearse_failure", "--host", "nope", "--gpu", "1")
    with pytest.raises(CommandError, match="has no GPU 9"):
        call_command("rehearse_failure", "--host", "hpc-provider-01", "--gpu", "9")

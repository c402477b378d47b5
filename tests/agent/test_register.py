"""`ibex-agent register` against a real local HTTP server."""

import json
import stat

import pytest

from agent.cli import main
from tests.agent.fake_ibex import PROVIDER_KEY, FakeIbex


@pytest.fixture
def ibex():
    with FakeIbex() as server:
        yield server


def register(ibex_url: str, state_path, *extra: str, key: str = PROVIDER_KEY) -> int:
    return main([
        "register", "--api", ibex_url, "--key", key, "--fabric", "fab1",
        "--hostname", "gpu01", "--gpu-model", "H100-80GB", "--gpus", "8",
        "--cpu-cores", "128", "--memory-gib", "2048", "--state", str(state_path), *extra,
    ])


def test_register_writes_the_state_file_and_prints_the_node_id(ibex, tmp_path, capsys):
    state_path = tmp_path / "lib" / "node.json"

    assert register(ibex.url, state_path) == 0

    node = ibex.node_named("gpu01")
    assert capsys.readouterr().out.strip() == str(node.id)
    state = json.loads(state_path.read_text())
    assert {k: state[k] for k in ("api", "node_id", "token", "hostname")} == {
        "api": ibex.url, "node_id": node.id, "token": node.token, "hostname": "gpu01",
    }
    assert stat.S_IMODE(state_path.stat().st_mode) == 0o600
    sent = ibex.requests[0]
    assert sent.headers["Authorization"] == f"Bearer {PROVIDER_KEY}"
    assert sent.body["fabric"] == "fab1"
    assert sent.body["gpu_model"] == "H100-80GB"
    assert sent.body["gpu_count"] == 8
    assert sent.body["cpu_cores"] == 128 and sent.body["memory_gib"] == 2048


def test_register_again_rotates_the_token_of_the_existing_node(ibex, tmp_path, capsys):
    existing = ibex.add_node("gpu01")
    old_token = existing.token
    state_path = tmp_path / "node.json"

    assert register(ibex.url, state_path) == 0

    assert capsys.readouterr().out.strip() == str(existing.id)
    assert existing.token != old_token
    assert json.loads(state_path.read_text())["token"] == existing.token
    assert ibex.paths() == [
        "/api/v1/nodes/", "/api/v1/nodes/", f"/api/v1/nodes/{existing.id}/rotate-token/",
    ]
    assert ibex.requests[1].query == {"hostname": ["gpu01"]}


def test_register_again_skips_retired_nodes_and_other_fabrics(ibex, tmp_path, capsys):
    ibex.add_node("gpu01", state="retired")
    ibex.add_node("gpu01", fabric="other-fabric")
    live = ibex.add_node("gpu01")
    ibex.add_node("gpu01", fabric="third-fabric")

    assert register(ibex.url, tmp_path / "node.json") == 0

    assert capsys.readouterr().out.strip() == str(live.id)
    assert json.loads((tmp_path / "node.json").read_text())["token"] == live.token


def test_a_bad_key_gives_one_line_and_exit_1(ibex, tmp_path, capsys):
    assert register(ibex.url, tmp_path / "node.json", key="wrong") == 1

    err = capsys.readouterr().err
    assert err == "ibex-agent: the server refused the key (401)\n"
    assert not (tmp_path / "node.json").exists()


def test_connection_refused_gives_one_line_and_no_traceback(tmp_path, capsys):
    assert register("http://127.0.0.1:1", tmp_path / "node.json") == 1

    assert capsys.readouterr().err == "ibex-agent: cannot reach http://127.0.0.1:1: connection refused\n"


def test_without_nvml_the_gpu_model_is_required(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["register", "--api", "http://127.0.0.1:1", "--key", "k", "--fabric", "f",
              "--state", str(tmp_path / "node.json")])

    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-model and --gpus are required without NVML" in err
    assert "Traceback" not in err


def test_state_path_defaults_to_the_environment_variable(ibex, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IBEX_AGENT_STATE", str(tmp_path / "from-env.json"))

    assert main(["register", "--api", ibex.url, "--key", PROVIDER_KEY, "--fabric", "f",
                 "--hostname", "gpu02", "--gpu-model", "H100-80GB", "--gpus", "8"]) == 0

    assert json.loads((tmp_path / "from-env.json").read_text())["hostname"] == "gpu02"


def test_an_unwritable_state_file_is_one_line(ibex, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")

    assert register(ibex.url, blocker / "node.json") == 1

    err = capsys.readouterr().err
    assert err.startswith(f"ibex-agent: cannot write {blocker / 'node.json'}: ")
    assert err.count("\n") == 1


def test_a_redirect_is_reported_not_followed(tmp_path, capsys):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class RedirectToHttps(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(301)
            self.send_header("Location", "https://ibex.example.org/api/v1/nodes/")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), RedirectToHttps)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        assert register(f"http://127.0.0.1:{server.server_address[1]}", tmp_path / "node.json") == 1
    finally:
        server.shutdown()
        server.server_close()

    assert capsys.readouterr().err == (
        "ibex-agent: the server redirects to https://ibex.example.org/api/v1/nodes/ (301); "
        "give that address (scheme and host) as --api\n"
    )

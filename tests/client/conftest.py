"""Fixtures of the client's tests: a stub API, a clean environment, and `ibex` run in-process.

The client reads `IBEX_API`, `IBEX_API_KEY`, `IBEX_PROFILE` and the config file under
`$XDG_CONFIG_HOME`: each test gets a home of its own and none of the caller's variables."""

from __future__ import annotations

import pytest

from ibex_client import cli
from tests.client.stub import StubApi

KEY = "ibex_0123456789ab_secretsecretsecretsecretsecretsecretsecret"


@pytest.fixture(autouse=True)
def client_env(tmp_path, monkeypatch):
    for name in ("IBEX_API", "IBEX_API_KEY", "IBEX_PROFILE", "IBEX_CONFIG", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home" / ".config"))
    return tmp_path / "home" / ".config" / "ibex" / "config.toml"


@pytest.fixture
def stub(monkeypatch):
    api = StubApi()
    monkeypatch.setenv("IBEX_API", api.url)
    monkeypatch.setenv("IBEX_API_KEY", KEY)
    yield api
    api.close()


@pytest.fixture
def ibex(capsys):
    """Run `ibex ARGS...` in this process: (exit status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = cli.main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


from tests.client.live import exchange  # noqa: E402, F401  - the live exchange, for test_live*

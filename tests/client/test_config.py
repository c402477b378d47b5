"""`ibex login` and where the client finds the API and its key: the config file (mode 600,
one table per profile), `IBEX_API` / `IBEX_API_KEY` over it, `--profile`."""

import os
import stat
import tomllib

from ibex_client import Client, config
from tests.client.conftest import KEY

WHOAMI = {"username": "alice", "organizations": ["acme-ai"], "api_key": "0123456789ab",
          "scopes": ["read", "trade"]}


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_it_stores_the_key_from_the_environment_in_a_file_only_its_owner_reads(
        stub, ibex, client_env):
    stub.answer("GET", "/api/v1/me/", (200, WHOAMI))

    code, out, err = ibex("login", "--api", stub.url)

    assert code == 0, err
    assert mode(client_env) == 0o600
    assert mode(client_env.parent) == 0o700
    stored = tomllib.loads(client_env.read_text())
    assert stored == {"profiles": {"default": {"api": stub.url, "key": KEY}}}
    assert stub.seen[0].headers["Authorization"] == f"Bearer {KEY}"
    assert "acme-ai" in out and KEY not in out


def test_it_reads_the_key_from_a_prompt_and_keeps_other_profiles(stub, ibex, client_env,
                                                                 monkeypatch):
    stub.answer("GET", "/api/v1/me/", (200, WHOAMI))
    config.save_profile("work", api="https://ibex.example.com", key="ibex_work_key")
    monkeypatch.delenv("IBEX_API_KEY")
    monkeypatch.setattr("getpass.getpass", lambda prompt: "ibex_typed_key\n")

    code, _, err = ibex("login", "--api", stub.url, "--profile", "lab", "--json")

    assert code == 0, err
    assert tomllib.loads(client_env.read_text())["profiles"] == {
        "lab": {"api": stub.url, "key": "ibex_typed_key"},
        "work": {"api": "https://ibex.example.com", "key": "ibex_work_key"}}
    assert mode(client_env) == 0o600


def test_the_file_is_600_whatever_the_umask(client_env):
    previous = os.umask(0)
    try:
        config.save_profile("default", api="http://127.0.0.1:1", key="k")
    finally:
        os.umask(previous)

    assert mode(client_env) == 0o600


def test_a_refused_key_is_not_stored(stub, ibex, client_env):
    stub.answer("GET", "/api/v1/me/", (401, {"error": {
        "code": "authentication_failed", "message": "Invalid API key.", "fields": {}}}))

    code, _, err = ibex("login", "--api", stub.url)

    assert code == 1
    assert err == "ibex: Invalid API key.\n"
    assert not client_env.exists()


def test_the_environment_overrides_the_profile(stub, monkeypatch):
    config.save_profile("default", api="http://127.0.0.1:9", key="ibex_stored")

    client = Client()
    assert (client.api, client._key) == (stub.url, KEY)

    monkeypatch.delenv("IBEX_API_KEY")
    client = Client()
    assert (client.api, client._key, client.key_source) == (stub.url, "ibex_stored",
                                                            "profile default")


def test_profile_picks_the_table(ibex, monkeypatch, stub):
    monkeypatch.delenv("IBEX_API")
    monkeypatch.delenv("IBEX_API_KEY")
    config.save_profile("default", api="http://127.0.0.1:9", key="ibex_default")
    config.save_profile("lab", api=stub.url, key="ibex_lab")
    stub.answer("GET", "/api/v1/account/", (200, {
        "organization": "acme-ai", "currency": "usd", "available": "1.00", "held": "0.00",
        "payable": "0.00", "held_back": "0.00", "spend_limit_per_hour": None,
        "spend_limit_per_month": None}))

    code, _, err = ibex("balance", "--profile", "lab")
    assert code == 0, err
    assert stub.seen[-1].headers["Authorization"] == "Bearer ibex_lab"

    monkeypatch.setenv("IBEX_PROFILE", "lab")
    assert Client().profile == "lab"


def test_without_configuration_it_says_what_to_do(ibex):
    code, out, err = ibex("balance")

    assert (code, out) == (1, "")
    assert "ibex login --api URL" in err and "IBEX_API" in err


def test_login_without_an_address_is_bad_usage(ibex, monkeypatch):
    monkeypatch.setenv("IBEX_API_KEY", KEY)

    code, _, err = ibex("login")

    assert code == 2
    assert "--api URL" in err

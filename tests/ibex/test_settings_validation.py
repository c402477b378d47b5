"""Settings come from the environment; a bad value stops the command with one clear line."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DEBUG": "0",
    "SECRET_KEY": secrets.token_urlsafe(60),
    "ALLOWED_HOSTS": "ibex.example.com",
}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env=full_env,
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_is_clean_with_production_values():
    result = manage("check", "--deploy", "--fail-level", "WARNING", **PRODUCTION)

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout


@pytest.mark.parametrize("url, words", [
    ("mysql://root@localhost/ibex", "DATABASE_URL must be a PostgreSQL URL"),
    ("postgresql://postgres@127.0.0.1:5432/", "DATABASE_URL names no database"),
    ("postgresql://postgres@127.0.0.1:notaport/ibex", "DATABASE_URL has a port that is not a number"),
])
def test_a_malformed_database_url_gives_one_clear_line(url, words):
    result = manage("check", DATABASE_URL=url)

    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert words in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_database_gives_one_clear_line():
    result = manage("migrate", DATABASE_URL="postgresql://postgres@127.0.0.1:1/ibex")

    assert result.returncode == 1
    assert result.stderr.startswith("ibex: cannot use PostgreSQL:")
    assert "check DATABASE_URL" in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_a_malformed_redis_url_gives_one_clear_line():
    result = manage("check", REDIS_URL="http://127.0.0.1:6379")

    assert result.returncode == 1
    assert "REDIS_URL must be a Redis URL" in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_an_unreachable_redis_stops_the_demo_runner_with_one_clear_line():
    env = {**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "IBEX_PORT": "18765"}
    result = subprocess.run([sys.executable, "-m", "ibex.run"], cwd=BASE_DIR, env=env,
                            capture_output=True, text=True, timeout=120)

    assert result.returncode == 1
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_non_boolean_debug_gives_one_clear_line():
    result = manage("check", DEBUG="maybe")

    assert result.returncode == 1
    assert "DEBUG='maybe' is not a boolean" in result.stderr


def test_a_short_secret_key_is_refused():
    result = manage("check", SECRET_KEY="too-short")

    assert result.returncode == 1
    assert "SECRET_KEY is shorter than 50 characters" in result.stderr

"""The embedded PostgreSQL and Redis: started by the first command, reused, stopped by the last."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest
import redis

BASE_DIR = Path(__file__).resolve().parents[2]
CLIENT = (
    "import json, sys\n"
    "from ibex.runtime import use_embedded_services\n"
    "print(json.dumps(use_embedded_services(database=True, broker=True)), flush=True)\n"
    "sys.stdin.readline()\n"
)


@pytest.fixture
def var_dir():
    path = Path(tempfile.mkdtemp(prefix="ibex-", dir="/tmp"))  # short: socket paths are limited
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_client(var_dir: Path) -> tuple[subprocess.Popen, dict]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env["IBEX_VAR_DIR"] = str(var_dir)
    process = subprocess.Popen([sys.executable, "-c", CLIENT], cwd=BASE_DIR, env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return process, json.loads(process.stdout.readline())


def finish(process: subprocess.Popen) -> None:
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.wait(timeout=60) == 0


def answers(urls: dict) -> bool:
    try:
        host = urls["DATABASE_URL"].split("host=")[1]
        psycopg.connect(host=host, user="postgres", dbname="ibex", connect_timeout=2).close()
        redis.Redis.from_url(urls["REDIS_URL"], socket_connect_timeout=1).ping()
    except (psycopg.Error, redis.RedisError, OSError):
        return False
    return True


def test_a_second_command_reuses_the_services_and_the_last_one_stops_them(var_dir):
    first, first_urls = start_client(var_dir)
    second, second_urls = start_client(var_dir)

    assert second_urls == first_urls
    assert answers(first_urls)

    finish(first)
    assert answers(second_urls), "the services stopped while a command still used them"

    finish(second)
    assert not answers(second_urls), "the services outlived the last command"
    assert (var_dir / "postgres" / "PG_VERSION").exists(), "the data is kept between runs"


def test_data_survives_a_restart_of_the_embedded_postgres(var_dir):
    first, urls = start_client(var_dir)
    host = urls["DATABASE_URL"].split("host=")[1]
    with psycopg.connect(host=host, user="postgres", dbname="ibex", autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (value text)")
        conn.execute("INSERT INTO kept VALUES ('still here')")
    finish(first)

    again, urls = start_client(var_dir)
    with psycopg.connect(host=host, user="postgres", dbname="ibex") as conn:
        assert conn.execute("SELECT value FROM kept").fetchone() == ("still here",)
    finish(again)


def test_a_client_killed_without_cleanup_does_not_keep_the_services_alive(var_dir):
    killed, urls = start_client(var_dir)
    killed.kill()
    killed.wait()

    last, _ = start_client(var_dir)
    finish(last)

    assert not answers(urls)

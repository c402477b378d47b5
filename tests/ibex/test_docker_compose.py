"""Docker cannot run here: prove instead that compose starts the entry points the tests start."""

import importlib
import re
from pathlib import Path

import yaml

from ibex.celery import app as celery_app

BASE_DIR = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((BASE_DIR / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def command(service: str) -> list[str]:
    return SERVICES[service]["command"]


def test_compose_runs_postgres_redis_web_worker_and_beat_with_health_checks():
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(SERVICES)
    for name in ("postgres", "redis", "web", "worker"):
        assert "healthcheck" in SERVICES[name], f"{name} has no health check"
    assert set(COMPOSE["volumes"]) == {"postgres-data", "redis-data"}


def test_the_web_service_serves_the_wsgi_application_the_tests_import():
    argv = command("web")
    assert argv[0] == "gunicorn"
    module_name, attribute = argv[1].split(":")

    application = getattr(importlib.import_module(module_name), attribute)

    assert callable(application)


def test_the_worker_and_beat_load_the_celery_app_with_our_tasks_and_schedule():
    assert command("worker")[:4] == ["celery", "-A", "ibex", "worker"]
    assert command("beat")[:4] == ["celery", "-A", "ibex", "beat"]

    app = importlib.import_module("ibex").celery_app
    app.loader.import_default_modules()

    assert app is celery_app
    assert "ibex.ping" in app.tasks
    for entry in app.conf.beat_schedule.values():
        assert entry["task"] in app.tasks, f"beat schedules unknown task {entry['task']}"


def test_the_test_suite_starts_the_same_celery_worker_command():
    conftest = (BASE_DIR / "tests" / "conftest.py").read_text()

    assert '"-m", "celery", "-A", "ibex", "worker"' in conftest


def test_every_app_service_gets_the_settings_variables_ibex_reads():
    settings_source = (BASE_DIR / "ibex" / "settings.py").read_text()
    environment = SERVICES["web"]["environment"]

    for name in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ALLOWED_HOSTS",
                 "STRIPE_API_KEY", "STRIPE_WEBHOOK_SECRET"):
        assert name in environment, f"compose does not set {name}"
        assert re.search(rf'["\']{name}["\']', settings_source), f"settings never read {name}"
    for service in ("worker", "beat", "migrate", "outbox"):
        assert SERVICES[service]["environment"] == environment


def test_the_outbox_relay_runs_the_command_the_demo_runs():
    from ibex.run import children

    assert command("outbox") == ["python", "manage.py", "relay_outbox"]
    assert children("127.0.0.1", 8000)["outbox"][1:] == ["manage.py", "relay_outbox"]

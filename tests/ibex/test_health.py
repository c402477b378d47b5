import pytest

from ibex.celery import app as celery_app

pytestmark = pytest.mark.django_db


def test_healthz_answers_while_the_process_is_alive(client):
    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_when_database_redis_and_a_worker_answer(client, celery_worker_process):
    response = client.get("/readyz")

    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert {name for name, check in body["checks"].items() if check["ok"]} == {
        "database", "redis", "celery"
    }


def test_readyz_is_503_naming_redis_when_redis_is_unreachable(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = client.get("/readyz")

    body = response.json()
    assert response.status_code == 503
    assert body["status"] == "fail"
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["redis"]["ok"] is False
    assert body["checks"]["celery"]["ok"] is False


def test_readyz_is_503_naming_celery_when_no_worker_answers(client, monkeypatch):
    monkeypatch.setattr(celery_app.control, "ping", lambda **kwargs: [])

    response = client.get("/readyz")

    body = response.json()
    assert response.status_code == 503
    assert body["checks"]["celery"] == {
        "ok": False, "detail": "RuntimeError: no Celery worker answered a ping",
        "ms": body["checks"]["celery"]["ms"],
    }


def test_readyz_is_503_naming_the_database_when_it_fails(client, monkeypatch):
    from ibex import health

    def broken():
        raise ConnectionError("database went away")

    monkeypatch.setattr(health, "check_database", broken)

    response = client.get("/readyz")

    assert response.status_code == 503
    assert response.json()["checks"]["database"]["detail"] == "ConnectionError: database went away"


def test_favicon_ico_leads_to_the_icon_the_pages_name(client, db):
    response = client.get("/favicon.ico")

    assert response.status_code == 301 and response["Location"].endswith(".svg")
    assert "web/favicon" in response["Location"]

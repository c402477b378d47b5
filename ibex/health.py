"""Liveness and readiness probes.

/healthz: the process answers. /readyz: PostgreSQL, Redis and at least one Celery worker
answer; JSON with each check's result and 503 when any fails.
"""

import time

import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import redirect
from django.templatetags.static import static
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from ibex.celery import app as celery_app
from ibex.tasks import BEAT_KEY

CELERY_PING_TIMEOUT_S = 1.0


def _timed(check) -> dict:
    started = time.perf_counter()
    try:
        detail = check()
        ok = True
    except Exception as exc:  # a probe reports every failure, whatever its kind
        detail = f"{type(exc).__name__}: {exc}".strip()
        ok = False
    return {"ok": ok, "detail": detail, "ms": round((time.perf_counter() - started) * 1000, 1)}


def check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "postgresql answered"


def check_redis() -> str:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
    client.ping()
    return "redis answered"


def check_celery() -> str:
    replies = celery_app.control.ping(timeout=CELERY_PING_TIMEOUT_S, limit=1)
    if not replies:
        raise RuntimeError("no Celery worker answered a ping")
    return f"{len(replies)} worker(s) answered"


def beat_age_s() -> float | None:
    try:
        last = cache.get(BEAT_KEY)
    except Exception:  # Redis down is reported by its own check
        return None
    return None if last is None else round(time.time() - last, 1)


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    checks = {
        "database": _timed(check_database),
        "redis": _timed(check_redis),
    }
    # Only ask the workers once the broker is known to answer: a ping to a dead broker
    # would hang on connection retries.
    if checks["redis"]["ok"]:
        checks["celery"] = _timed(check_celery)
    else:
        checks["celery"] = {"ok": False, "detail": "skipped: redis is down", "ms": 0.0}
    ready = all(check["ok"] for check in checks.values())
    body = {"status": "ok" if ready else "fail", "checks": checks, "beat_age_s": beat_age_s()}
    return JsonResponse(body, status=200 if ready else 503)


def favicon(request):
    """Browsers ask every site for /favicon.ico: send them to the icon the pages name."""
    return redirect(static("web/favicon.svg"), permanent=True)

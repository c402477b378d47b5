"""Reading and checking IBEX's settings from the environment.

Every problem is raised as `ConfigError` with one line that says what is wrong and how to
fix it; `manage.py` and the runner print that line instead of a traceback. No Django here:
settings import this before Django is configured.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit


class ConfigError(Exception):
    """A setting is missing or malformed; the message is one line meant for a person."""


TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str) -> dict:
    """Django's DATABASES entry for a postgres:// URL.

    The host may be a socket directory, given as `?host=/path` (as libpq does).
    """
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ConfigError(
            f"DATABASE_URL must be a PostgreSQL URL such as postgresql://USER:PASSWORD@HOST:5432/NAME "
            f"(got scheme {parts.scheme or 'none'!r}); IBEX runs on PostgreSQL only"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise ConfigError("DATABASE_URL names no database: end it with /NAME, e.g. .../ibex")
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"DATABASE_URL has a port that is not a number: {url!r}") from None
    host = query.pop("host", None) or (parts.hostname or "")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port or ""),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {"connect_timeout": 5, **query},
    }


def check_redis_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in {"redis", "rediss"}:
        raise ConfigError(
            f"REDIS_URL must be a Redis URL such as redis://HOST:6379/0 (got scheme {parts.scheme or 'none'!r})"
        )
    try:
        _ = parts.port  # urllib checks the port only when asked
    except ValueError:
        raise ConfigError(f"REDIS_URL has a port that is not a number: {url!r}") from None
    return url

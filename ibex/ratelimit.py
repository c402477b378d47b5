"""A fixed-window rate limiter over the cache, for what DRF's throttles do not reach: the web
login form and web forms that create credentials.

`allowed(scope, ident)` counts one attempt and says whether it is within the limit set in
settings.IBEX_RATE_LIMITS (e.g. {"login": "10/5m"}); `peek` only reads. Counters are atomic
(cache.add + cache.incr on Redis). When the cache is unreachable the limiter lets attempts
through and logs it.
"""

import logging
import time

from django.conf import settings
from django.core.cache import cache

log = logging.getLogger(__name__)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """'10/5m' → (10, 300); '30/hour' → (30, 3600)."""
    count, _, period = rate.partition("/")
    digits = "".join(ch for ch in period if ch.isdigit()) or "1"
    unit = period.lstrip("0123456789")[:1]
    return int(count), int(digits) * UNITS[unit]


def _key(scope: str, ident: str) -> tuple[str, int, int]:
    limit, window = parse_rate(settings.IBEX_RATE_LIMITS[scope])
    bucket = int(time.time() // window)
    return f"ratelimit:{scope}:{ident}:{bucket}", limit, window


def allowed(scope: str, ident: str) -> bool:
    """Count one attempt; False once the window's limit is passed."""
    key, limit, window = _key(scope, ident)
    try:
        cache.add(key, 0, timeout=window)
        return cache.incr(key) <= limit
    except Exception as exc:  # noqa: BLE001 - any cache failure: let the attempt through
        log.warning("rate limit %s not checked, the cache is unreachable: %s", scope, exc)
        return True


def exhausted(scope: str, ident: str) -> bool:
    """Whether the window's limit is already used up (counts nothing)."""
    key, limit, _ = _key(scope, ident)
    try:
        return (cache.get(key) or 0) >= limit
    except Exception:  # noqa: BLE001
        return False


def client_ip(request) -> str:
    return request.META.get("REMOTE_ADDR", "") or "unknown"

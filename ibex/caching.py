"""Values worth keeping for a while in the cache (Redis), and computed afresh when Redis is
down: a reading that only saves time must never be why a request fails (an order taken while
Redis is down still goes through the outbox)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import redis
from django.core.cache import cache

T = TypeVar("T")


def remembered(key: str, seconds: int, compute: Callable[[], T]) -> T:
    """`compute()`, kept under `key` for `seconds`; computed each time Redis cannot answer."""
    try:
        found = cache.get(key)
    except (redis.RedisError, OSError):
        return compute()
    if found is not None:
        return found
    value = compute()
    try:
        cache.set(key, value, seconds)
    except (redis.RedisError, OSError):
        pass  # kept next time
    return value

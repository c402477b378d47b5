"""A value kept in the cache only saves time: without Redis it is computed each time."""

import pytest
import redis
from django.core.cache import cache
from django.test import override_settings

from ibex.caching import remembered

NO_REDIS = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                        "LOCATION": "redis://127.0.0.1:1/0"}}  # nothing listens there


def test_a_value_is_computed_once_and_then_read_from_the_cache():
    calls = []
    cache.delete("test:remembered")

    first = remembered("test:remembered", 60, lambda: calls.append(1) or {"answer": 42})
    again = remembered("test:remembered", 60, lambda: calls.append(1) or {"answer": 0})

    assert first == again == {"answer": 42} and len(calls) == 1


def test_without_redis_the_value_is_computed_and_nothing_fails():
    with override_settings(CACHES=NO_REDIS):
        with pytest.raises(redis.ConnectionError):
            cache.get("test:remembered")  # Redis is really out of reach here

        assert remembered("test:remembered", 60, lambda: "fresh") == "fresh"

"""Rate limits for the API: per organisation for orders and key creation, per node for
heartbeats, and the default per-user and anonymous limits.

Rates live in REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] and are read when a request arrives, so a
changed setting takes effect at once. The counters live in the cache (Redis); when the cache is
unreachable a throttle lets the request through and logs it, so a Redis outage does not turn
into refused orders (the outbox keeps orders taken during the outage).
"""

import logging

from rest_framework import throttling
from rest_framework.settings import api_settings

from ibex.accounts.models import ApiKey

log = logging.getLogger(__name__)


class _FailOpen:
    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # noqa: BLE001 - any cache failure: serve, do not refuse
            log.warning("rate limit %s not checked, the cache is unreachable: %s", self.scope, exc)
            return True


class AnonRateThrottle(_FailOpen, throttling.AnonRateThrottle):
    pass


class UserRateThrottle(_FailOpen, throttling.UserRateThrottle):
    pass


class OrganizationThrottle(_FailOpen, throttling.SimpleRateThrottle):
    """Counts per organisation (all its keys and members together), else per client address."""

    def get_cache_key(self, request, view):
        if isinstance(request.auth, ApiKey):
            ident = f"org-{request.auth.organization_id}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            ident = self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


class OrderThrottle(OrganizationThrottle):
    scope = "orders"


class KeyCreationThrottle(OrganizationThrottle):
    scope = "keys"


class HeartbeatThrottle(_FailOpen, throttling.SimpleRateThrottle):
    """Counts per node: an agent that heartbeats far faster than asked is refused."""

    scope = "heartbeat"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": view.kwargs.get("pk")}


class NodeLogsThrottle(HeartbeatThrottle):
    """Counts log shipments per node: an agent ships each running lease's output every second."""

    scope = "node_logs"

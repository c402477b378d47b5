"""The request being served, if any, so that services can tell who acts and from where without
every caller passing it down. Set by AuditContextMiddleware; Celery tasks have none (system)."""

import contextvars

_request = contextvars.ContextVar("ibex_audit_request", default=None)


class AuditContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        token = _request.set(request)
        try:
            return self.get_response(request)
        finally:
            _request.reset(token)


def current_request():
    return _request.get()


def client_ip(request) -> str | None:
    """The peer's address. Behind a proxy, run gunicorn with --forwarded-allow-ips so that
    REMOTE_ADDR is the client's, not the proxy's."""
    return request.META.get("REMOTE_ADDR") or None

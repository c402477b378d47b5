"""record_audit: the one way audit entries are written. Call it inside the service's own
transaction, so an entry exists exactly when the action it records committed."""

from __future__ import annotations

from django.db import models

from ibex.audit.context import client_ip, current_request
from ibex.audit.models import AuditEntry


def _target(target) -> tuple[str, str]:
    if target is None:
        return "", ""
    if isinstance(target, models.Model):
        return target._meta.label_lower, str(target.pk)
    kind, _, ident = str(target).partition(":")
    return kind, ident


def _from_request(request) -> tuple[str, str, str | None]:
    """(user name, via, ip) of the request being served; ("system", "task", None) without one."""
    if request is None:
        return "system", "task", None
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else "anonymous"
    auth = getattr(request, "auth", None)
    prefix = getattr(auth, "prefix", None)
    if prefix:
        via = f"api key {prefix}"
    elif request.path.startswith("/admin/"):
        via = "admin"
    elif request.path.startswith("/api/"):
        via = "api session"
    else:
        via = "web"
    return name, via, client_ip(request)


def record_audit(*, action: str, target=None, actor: str | None = None, organization=None,
                 amount_micros: int | None = None, details: dict | None = None,
                 ip: str | None = None, via: str | None = None) -> AuditEntry:
    """Record who (`actor`, else the request's user, else "system"), what (`action` on
    `target`: a model instance or "type:id"), for which organisation, for how much, from where
    (`ip`, else the request's address)."""
    name, request_via, request_ip = _from_request(current_request())
    target_type, target_id = _target(target)
    return AuditEntry.objects.create(
        actor=(actor or name)[:150], via=(via or request_via)[:60], ip=ip or request_ip,
        action=action, target_type=target_type[:60], target_id=target_id[:64],
        organization=str(getattr(organization, "slug", organization or ""))[:64],
        amount_micros=amount_micros, details=details or {})

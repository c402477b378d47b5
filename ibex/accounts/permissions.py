"""Who the caller acts for, and what the key they use allows."""

from rest_framework import exceptions, permissions

from ibex.accounts.models import ApiKey, Organization

ALL_SCOPES = frozenset(ApiKey.Scope.values)


def organization_of(request) -> Organization:
    """The organisation a request acts for: the API key's, else the user's first one."""
    if isinstance(request.auth, ApiKey):
        return request.auth.organization
    membership = (
        request.user.memberships.select_related("organization").order_by("organization__slug").first()
        if request.user.is_authenticated else None
    )
    if membership is None:
        raise exceptions.PermissionDenied("You belong to no organisation.")
    return membership.organization


def scopes_of(request) -> frozenset[str]:
    if isinstance(request.auth, ApiKey):
        return frozenset(request.auth.scopes)
    return ALL_SCOPES if request.user.is_authenticated else frozenset()


class _ScopePermission(permissions.BasePermission):
    scope = "read"
    message = "This API key lacks the scope this action needs."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        needed = "read" if request.method in permissions.SAFE_METHODS else self.scope
        granted = scopes_of(request)
        return needed in granted or "admin" in granted


class ReadOrProvide(_ScopePermission):
    """Reads need `read`; writes need `provide` (providers' inventory and fabrics)."""

    scope = "provide"
    message = "Changing this needs an API key with the 'provide' scope."


class ReadOrTrade(_ScopePermission):
    scope = "trade"
    message = "Trading needs an API key with the 'trade' scope."


class Read(_ScopePermission):
    """`read` whatever the method: for a POST that changes nothing (a quote)."""

    scope = "read"

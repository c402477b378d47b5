"""Who a signed-in person acts for on the web pages: the organisation of their first
membership (as the API does for session users)."""

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render

from ibex.accounts.models import Membership, Organization


def organization_for(user) -> Organization | None:
    if not user.is_authenticated:
        return None
    membership = (Membership.objects.filter(user=user).select_related("organization")
                  .order_by("organization__slug").first())
    return membership.organization if membership else None


def _needs_role(flag: str | None, label: str):
    def decorator(view):
        @login_required
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            org = organization_for(request.user)
            if org is None or (flag and not getattr(org, flag)):
                if org is not None and flag == "is_tenant" and org.is_provider:
                    return redirect("web:provider")
                return render(request, "web/forbidden.html", {"role": label}, status=403)
            request.organization = org
            return view(request, *args, **kwargs)
        return wrapper
    return decorator


tenant_required = _needs_role("is_tenant", "tenant")
provider_required = _needs_role("is_provider", "provider")
member_required = _needs_role(None, "member of an organisation")


def is_operator(user) -> bool:
    """Staff of this installation, or a member of an operator organisation."""
    if not user.is_authenticated:
        return False
    if user.is_staff:
        return True
    return Membership.objects.filter(user=user, organization__is_operator=True).exists()


def operator_required(view):
    """Operators only: others are sent to log in, or told the page does not exist (an
    operations console is not advertised to tenants)."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not is_operator(request.user):
            raise Http404("no such page")
        return view(request, *args, **kwargs)
    return wrapper

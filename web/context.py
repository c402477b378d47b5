from django.utils.functional import SimpleLazyObject

from web.orgs import organization_for


def web_org(request):
    """`web_org`: the signed-in person's organisation (looked up only when a page uses it)."""
    return {"web_org": SimpleLazyObject(lambda: organization_for(request.user))}

from django.utils.functional import SimpleLazyObject

from web.orgs import is_operator, organization_for


def web_org(request):
    """`web_org`: the signed-in person's organisation; `web_is_operator`: whether they may see
    the operations console (each looked up only when a page uses it)."""
    return {"web_org": SimpleLazyObject(lambda: organization_for(request.user)),
            "web_is_operator": SimpleLazyObject(lambda: is_operator(request.user))}

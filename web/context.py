from django.utils.functional import SimpleLazyObject

from web.orgs import is_operator, organization_for


def web_org(request):
    """`web_org`: the signed-in person's organisation; `web_is_operator`: whether they may see
    the operations console; `web_sees_pools`: whether the private-pool pages have anything for
    them (operators, and organisations with quota). Each looked up only when a page uses it,
    and once."""
    org = SimpleLazyObject(lambda: organization_for(request.user))
    operator = SimpleLazyObject(lambda: is_operator(request.user))

    def sees_pools() -> bool:
        from pool.models import QuotaNode

        if operator:
            return True
        org_id = getattr(org, "pk", None)
        return org_id is not None and QuotaNode.objects.filter(organization_id=org_id).exists()

    return {"web_org": org, "web_is_operator": operator,
            "web_sees_pools": SimpleLazyObject(sees_pools)}

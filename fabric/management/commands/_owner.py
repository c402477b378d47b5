from django.core.management.base import CommandError

from fabric.models import Fabric
from ibex.accounts.models import Organization

OPERATOR_SLUG = "ibex-operators"


def resolve_owner(owner_slug: str | None, fabric_name: str) -> Organization:
    """--owner, else the existing fabric's owner, else the operators' organisation."""
    if owner_slug:
        owner = Organization.objects.filter(slug=owner_slug).first()
        if owner is None:
            raise CommandError(f"no organisation {owner_slug!r}")
        return owner
    existing = Fabric.objects.filter(name=fabric_name).select_related("owner").first()
    if existing is not None:
        return existing.owner
    owner, _ = Organization.objects.get_or_create(
        slug=OPERATOR_SLUG, defaults={"name": "IBEX operators", "is_operator": True}
    )
    return owner

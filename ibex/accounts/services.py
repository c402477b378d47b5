"""Every change to organisations, memberships and API keys goes through here."""

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from ibex.accounts.models import (
    ApiKey,
    Membership,
    Organization,
    ProviderProfile,
    ProviderStateChange,
)
from ibex.audit.services import record_audit
from ibex.errors import Refusal
from ibex.statemachine import StateMachine, transition

KEY_PREFIX = "ibex"
ROLES = ("tenant", "provider", "operator")


def hash_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    raw_key: str  # shown once, never stored


@transaction.atomic
def create_organization(*, slug: str, name: str = "", roles: tuple[str, ...] = (),
                        owner=None) -> Organization:
    unknown = set(roles) - set(ROLES)
    if unknown:
        raise ValueError(f"unknown role(s): {', '.join(sorted(unknown))}")
    organization = Organization.objects.create(
        slug=slug,
        name=name or slug,
        is_tenant="tenant" in roles,
        is_provider="provider" in roles,
        is_operator="operator" in roles,
    )
    if organization.is_provider:
        ProviderProfile.objects.create(organization=organization)
    if owner is not None:
        Membership.objects.create(user=owner, organization=organization,
                                  role=Membership.Role.OWNER)
    return organization


# --- provider onboarding: pending -> verified -> suspended ----------------------------------

PROVIDER_TRANSITIONS = {
    ProviderProfile.State.PENDING: {ProviderProfile.State.VERIFIED, ProviderProfile.State.SUSPENDED},
    ProviderProfile.State.VERIFIED: {ProviderProfile.State.SUSPENDED},
    ProviderProfile.State.SUSPENDED: {ProviderProfile.State.VERIFIED},
}


class TransitionError(Refusal):
    """A state change that the transition table does not allow."""

    code = "invalid_state"


PROVIDER_MACHINE = StateMachine(
    name="provider", transitions=PROVIDER_TRANSITIONS, refusal=TransitionError,
    history=ProviderStateChange, history_of=lambda profile: {"profile": profile},
    audit=lambda profile, change: {"action": f"provider.{change.to_state}", "target": profile,
                                   "organization": profile.organization,
                                   "details": {"reason": change.reason}})


@transaction.atomic
def change_provider_state(*, organization: Organization, to_state: str, actor: str,
                          reason: str) -> ProviderProfile:
    """The one way a provider's onboarding state changes."""
    profile = ProviderProfile.objects.select_related("organization").get(organization=organization)
    return transition(PROVIDER_MACHINE, profile, to_state, actor=actor, reason=reason)


@transaction.atomic
def update_provider_details(*, organization: Organization, **details) -> ProviderProfile:
    profile = ProviderProfile.objects.select_for_update().get(organization=organization)
    for field, value in details.items():
        setattr(profile, field, value)
    profile.save(update_fields=list(details))
    record_audit(action="provider.details", target=profile, organization=organization,
                 details={"fields": sorted(details)})
    return profile


@transaction.atomic
def default_scopes(organization: Organization) -> list[str]:
    """The scopes a key needs to do what the organisation's roles do."""
    scopes = ["read"]
    for has_role, scope in ((organization.is_tenant, "trade"),
                            (organization.is_provider, "provide"),
                            (organization.is_operator, "admin")):
        if has_role:
            scopes.append(scope)
    return scopes


def issue_api_key(*, organization: Organization, scopes: list[str], name: str = "",
                  user=None, expires_at: datetime | None = None) -> IssuedKey:
    """Create a key for an organisation; without a user, the org's service user holds it."""
    unknown = set(scopes) - set(ApiKey.Scope.values)
    if unknown:
        raise ValueError(f"unknown scope(s): {', '.join(sorted(unknown))}")
    if user is None:
        user = _service_user(organization)
    prefix = secrets.token_hex(6)
    raw_key = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        organization=organization, user=user, name=name, prefix=prefix,
        key_hash=hash_key(raw_key), scopes=sorted(set(scopes)), expires_at=expires_at,
    )
    record_audit(action="api_key.issue", target=api_key, organization=organization,
                 details={"prefix": prefix, "scopes": api_key.scopes})
    return IssuedKey(api_key=api_key, raw_key=raw_key)


def _service_user(organization: Organization):
    user, _ = get_user_model().objects.get_or_create(username=f"{organization.slug}-service")
    Membership.objects.get_or_create(
        user=user, organization=organization, defaults={"role": Membership.Role.ADMIN}
    )
    return user


@transaction.atomic
def revoke_api_key(*, api_key: ApiKey) -> None:
    if ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()):
        record_audit(action="api_key.revoke", target=api_key,
                     organization=api_key.organization, details={"prefix": api_key.prefix})

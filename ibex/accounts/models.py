"""Organisations, the people in them, and the API keys they act through."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from ibex.statemachine import StateChange


class Organization(models.Model):
    """A company, department or team that rents GPUs, provides them, or runs the exchange."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    is_tenant = models.BooleanField(default=False)
    is_provider = models.BooleanField(default=False)
    is_operator = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner"
        ADMIN = "admin"
        MEMBER = "member"
        BILLING = "billing"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="memberships")
    organization = models.ForeignKey(Organization, on_delete=models.CASCADE,
                                     related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "organization"], name="one_membership_per_org"),
        ]

    def __str__(self):
        return f"{self.user} in {self.organization} ({self.role})"


class ApiKey(models.Model):
    """A bearer key: shown once, stored as a SHA-256 hash, found by its visible prefix."""

    class Scope(models.TextChoices):
        READ = "read"
        TRADE = "trade"
        PROVIDE = "provide"
        ADMIN = "admin"

    organization = models.ForeignKey(Organization, on_delete=models.CASCADE,
                                     related_name="api_keys")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    key_hash = models.CharField(max_length=64, unique=True)
    scopes = ArrayField(models.CharField(max_length=16, choices=Scope.choices), default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(scopes__contained_by=["read", "trade", "provide", "admin"]),
                name="api_key_scopes_known",
            ),
        ]

    def __str__(self):
        return f"{self.prefix}… ({self.organization})"


class ProviderProfile(models.Model):
    """A provider's onboarding: only verified providers' GPUs are offered to tenants."""

    class State(models.TextChoices):
        PENDING = "pending"
        VERIFIED = "verified"
        SUSPENDED = "suspended"

    organization = models.OneToOneField(Organization, on_delete=models.CASCADE,
                                        related_name="provider_profile")
    state = models.CharField(max_length=12, choices=State.choices, default=State.PENDING)
    legal_name = models.CharField(max_length=200, blank=True)
    country = models.CharField(max_length=2, blank=True, help_text="ISO 3166 alpha-2")
    payout_email = models.EmailField(blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"{self.organization} ({self.state})"


class ProviderStateChange(StateChange):
    """One row per onboarding transition; the actor is a user name, or 'system' for burn-in."""

    profile = models.ForeignKey(ProviderProfile, on_delete=models.CASCADE, related_name="changes")

    def __str__(self):
        return f"{self.from_state} → {self.to_state} by {self.actor}"

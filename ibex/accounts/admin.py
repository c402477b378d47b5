from django.contrib import admin, messages

from ibex.accounts import services
from ibex.accounts.models import ApiKey, Membership, Organization, ProviderProfile


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "is_tenant", "is_provider", "is_operator", "created_at"]
    list_filter = ["is_tenant", "is_provider", "is_operator"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["prefix", "organization", "name", "scopes", "created_at", "expires_at",
                    "revoked_at", "last_used_at"]
    list_filter = ["revoked_at"]
    search_fields = ["prefix", "name", "organization__slug"]
    readonly_fields = ["prefix", "key_hash", "last_used_at", "created_at"]


@admin.register(ProviderProfile)
class ProviderProfileAdmin(admin.ModelAdmin):
    list_display = ["organization", "state", "legal_name", "country", "payout_email",
                    "state_changed_at"]
    list_filter = ["state", "country"]
    search_fields = ["organization__slug", "legal_name", "payout_email"]
    readonly_fields = ["state", "state_changed_at"]
    actions = ["verify", "suspend"]

    def _change(self, request, queryset, to_state):
        for profile in queryset:
            try:
                services.change_provider_state(organization=profile.organization,
                                               to_state=to_state, actor=request.user.username,
                                               reason="admin action")
            except services.TransitionError as exc:
                self.message_user(request, f"{profile.organization}: {exc}", messages.WARNING)

    @admin.action(description="Verify selected providers")
    def verify(self, request, queryset):
        self._change(request, queryset, ProviderProfile.State.VERIFIED)

    @admin.action(description="Suspend selected providers")
    def suspend(self, request, queryset):
        self._change(request, queryset, ProviderProfile.State.SUSPENDED)

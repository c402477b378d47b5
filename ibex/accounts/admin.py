from django.contrib import admin

from ibex.accounts.models import ApiKey, Membership, Organization


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

"""Admin pieces every app shares."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Money rows change only through services: the admin shows them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

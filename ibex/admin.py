"""What the apps' admin modules share."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows that change only through an app's services: operators watch them here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

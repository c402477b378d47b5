from django.contrib import admin

from fabric.models import Fabric, Hca, Host, Link, Port, Switch


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "kind", "link_rate_gbps", "source", "updated_at"]
    list_filter = ["kind", "source", "owner"]
    search_fields = ["name", "owner__slug"]
    readonly_fields = ["summary", "created_at", "updated_at"]


@admin.register(Switch)
class SwitchAdmin(admin.ModelAdmin):
    list_display = ["name", "guid", "tier", "fabric", "port_count", "group"]
    list_filter = ["tier", "fabric"]
    search_fields = ["name", "guid"]
    list_select_related = ["fabric"]


@admin.register(Host)
class HostAdmin(admin.ModelAdmin):
    list_display = ["name", "fabric", "leaf", "spine", "gpus", "bandwidth_gbps"]
    list_filter = ["fabric"]
    search_fields = ["name", "leaf", "spine"]
    list_select_related = ["fabric"]


@admin.register(Hca)
class HcaAdmin(admin.ModelAdmin):
    list_display = ["guid", "host", "fabric", "description"]
    list_filter = ["fabric"]
    search_fields = ["guid", "host__name", "description"]
    list_select_related = ["fabric", "host"]


class PortInline(admin.TabularInline):
    model = Port
    fields = ["link_end", "device_guid", "number", "switch", "hca"]
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Link)
class LinkAdmin(admin.ModelAdmin):
    list_display = ["id", "fabric", "rate_gbps", "width", "state"]
    list_filter = ["state", "rate_gbps", "width", "fabric"]
    search_fields = ["ends__device_guid"]
    inlines = [PortInline]

from django.contrib import admin

from fabric.models import (
    Fabric,
    Hca,
    Host,
    Link,
    LinkFault,
    LinkStateChange,
    Partition,
    Port,
    PortCounters,
    Switch,
    TrafficAccount,
)


@admin.register(Fabric)
class FabricAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "kind", "link_rate_gbps", "source", "agent_reachable",
                    "agent_seen_at", "updated_at"]
    list_filter = ["kind", "source", "owner"]
    search_fields = ["name", "owner__slug"]
    readonly_fields = ["summary", "agent_seen_at", "agent_reachable", "agent_error",
                       "live_seen_at", "live_topology_hash", "live_summary", "created_at",
                       "updated_at",
                       # set through the API (fabric.services.set_pkey_range, set_qos,
                       # update_fabric_settings) and the agent
                       "pkey_first", "pkey_last", "provider_pkeys", "qos", "error_threshold"]


@admin.register(Partition)
class PartitionAdmin(admin.ModelAdmin):
    """Leases' partitions: written by the pool's bindings alone (fabric.services.sync_partitions)."""

    list_display = ["holder", "pkey_hex", "bandwidth_class", "fabric", "created_at",
                    "released_at"]
    list_filter = ["fabric", "bandwidth_class"]
    search_fields = ["holder"]
    list_select_related = ["fabric"]
    readonly_fields = ["fabric", "pkey", "holder", "bandwidth_class", "hosts", "created_at",
                       "released_at"]

    @admin.display(description="P_Key", ordering="pkey")
    def pkey_hex(self, partition):
        return f"{partition.pkey:#06x}"

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(LinkFault)
class LinkFaultAdmin(admin.ModelAdmin):
    """Links down or erring, as the fabric agent's reports showed them (read only: written by
    fabric.services.record_fabric_report)."""

    list_display = ["name", "kind", "detail", "fabric", "started_at", "ended_at"]
    list_filter = ["kind", "fabric"]
    search_fields = ["name"]
    list_select_related = ["fabric"]
    readonly_fields = ["fabric", "link", "kind", "name", "detail", "started_at", "ended_at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TrafficAccount)
class TrafficAccountAdmin(admin.ModelAdmin):
    """What each lease's hosts sent (read only: the pool's bindings open and close them, the
    fabric agent's reports add to them)."""

    list_display = ["holder", "host", "words", "first_at", "last_at", "opened_at", "closed_at"]
    search_fields = ["holder", "host__name"]
    list_select_related = ["host"]
    readonly_fields = ["holder", "host", "words", "first_at", "last_at", "opened_at",
                       "closed_at"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


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
    list_display = ["id", "fabric", "rate_gbps", "width", "state", "state_changed_at"]
    list_filter = ["state", "rate_gbps", "width", "fabric"]
    search_fields = ["ends__device_guid"]
    inlines = [PortInline]


@admin.register(LinkStateChange)
class LinkStateChangeAdmin(admin.ModelAdmin):
    """The cables' history as the fabric agent saw it: read-only."""

    list_display = ["at", "fabric", "link", "from_state", "to_state"]
    list_filter = ["to_state", "fabric"]
    list_select_related = ["fabric", "link"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(PortCounters)
class PortCountersAdmin(admin.ModelAdmin):
    """Each port's latest counters and the sample before: read-only, written by the agent."""

    list_display = ["port", "fabric", "sampled_at", "xmit_data", "rcv_data", "symbol_errors",
                    "link_downed", "rcv_errors", "xmit_discards"]
    list_filter = ["fabric"]
    search_fields = ["port__device_guid"]
    list_select_related = ["fabric", "port"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

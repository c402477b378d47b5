from django.contrib import admin, messages
from django.db.models import Count, Q

from pool import services
from pool.models import (
    Binding,
    Gpu,
    GpuModel,
    HealthEvent,
    Node,
    NodeStateChange,
    Pool,
    PriorityClass,
    Quota,
    QuotaNode,
    TidalRun,
    TidalStep,
)


@admin.register(GpuModel)
class GpuModelAdmin(admin.ModelAdmin):
    list_display = ["name", "architecture", "memory_mib", "bf16_tflops", "mig_capable"]


class GpuInline(admin.TabularInline):
    model = Gpu
    fields = ["index", "uuid", "gpu_model", "memory_mib", "health"]
    readonly_fields = fields
    extra = 0
    can_delete = False


class StateChangeInline(admin.TabularInline):
    model = NodeStateChange
    fields = ["at", "from_state", "to_state", "actor", "reason"]
    readonly_fields = fields
    extra = 0
    can_delete = False


class InventoryFilter(admin.SimpleListFilter):
    """Nodes whose agent reports other GPUs than were registered (pool.services)."""

    title = "GPU inventory"
    parameter_name = "inventory"

    def lookups(self, request, model_admin):
        return [("mismatch", "differs from registration"), ("agrees", "agrees")]

    def queryset(self, request, queryset):
        if self.value() == "mismatch":
            return queryset.exclude(inventory_mismatch="")
        if self.value() == "agrees":
            return queryset.filter(inventory_mismatch="")
        return queryset


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    # state and health first: on a 1280-px screen the right-hand columns are cut off
    list_display = ["hostname", "state", "health", "gpus_unhealthy", "gpus", "provider", "fabric",
                    "leaf", "gpu_model", "drain_mode", "last_heartbeat_at"]
    list_filter = ["state", "health", InventoryFilter, "gpu_model", "fabric", "provider"]
    search_fields = ["hostname", "provider__slug", "host__leaf"]
    list_select_related = ["provider", "fabric", "gpu_model", "host"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            gpu_count=Count("gpus", distinct=True),
            gpu_unhealthy=Count("gpus", distinct=True, filter=~Q(gpus__health=Gpu.Health.OK)))

    @admin.display(description="leaf", ordering="host__leaf")
    def leaf(self, node):
        return node.host.leaf

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpus(self, node):
        return node.gpu_count

    @admin.display(description="GPUs not ok", ordering="gpu_unhealthy")
    def gpus_unhealthy(self, node):
        return node.gpu_unhealthy
    readonly_fields = ["state", "drain_mode", "health", "last_heartbeat_at", "healthy_since",
                       "inventory_mismatch", "token_prefix", "token_hash", "state_changed_at", "created_at"]
    inlines = [GpuInline, StateChangeInline]
    actions = ["drain", "drain_moving_leases", "take_offline", "retire"]

    def _change(self, request, queryset, to_state, reason):
        done = []
        for node in queryset:
            try:
                services.change_node_state(node=node, to_state=to_state,
                                           actor=request.user.username, reason=reason)
                done.append(node.hostname)
            except services.NodeTransitionError as exc:
                self.message_user(request, f"{node}: {exc}", messages.WARNING)
        self._say_done(request, done, f"now {to_state}")

    def _drain(self, request, queryset, mode):
        done = []
        for node in queryset:
            try:
                services.drain_node(node=node, actor=request.user.username, mode=mode,
                                    reason="drained by an operator")
                done.append(node.hostname)
            except services.NodeTransitionError as exc:
                self.message_user(request, f"{node}: {exc}", messages.WARNING)
        how = ("its leases move off" if mode == Node.DrainMode.MOVE
               else "its leases run to their end")
        self._say_done(request, done, f"draining: no new leases, {how}")

    def _say_done(self, request, hostnames, what):
        if hostnames:
            names = ", ".join(sorted(hostnames)[:10]) + (" …" if len(hostnames) > 10 else "")
            self.message_user(request, f"{len(hostnames)} node{'s' if len(hostnames) != 1 else ''}"
                                       f" {what}: {names}", messages.SUCCESS)

    @admin.action(description="Drain selected nodes: no new leases, running ones finish here")
    def drain(self, request, queryset):
        self._drain(request, queryset, Node.DrainMode.RUN_TO_END)

    @admin.action(description="Drain selected nodes: no new leases, move running ones off")
    def drain_moving_leases(self, request, queryset):
        self._drain(request, queryset, Node.DrainMode.MOVE)

    @admin.action(description="Take selected nodes offline")
    def take_offline(self, request, queryset):
        self._change(request, queryset, Node.State.OFFLINE, "taken offline by an operator")

    @admin.action(description="Retire selected nodes")
    def retire(self, request, queryset):
        self._change(request, queryset, Node.State.RETIRED, "retired by an operator")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["__str__", "gpu_model", "memory_mib", "health", "health_changed_at"]
    list_filter = ["health", "gpu_model"]
    search_fields = ["node__hostname", "uuid"]
    list_select_related = ["node", "gpu_model"]


@admin.register(HealthEvent)
class HealthEventAdmin(admin.ModelAdmin):
    list_display = ["at", "node", "gpu", "kind", "from_value", "to_value", "detail"]
    list_filter = ["kind"]
    search_fields = ["node__hostname"]
    list_select_related = ["node", "gpu"]


@admin.register(Binding)
class BindingAdmin(admin.ModelAdmin):
    list_display = ["lease_ref", "node", "gpu_indexes", "serve", "acknowledged_at", "stopped_at"]
    list_filter = ["serve"]
    search_fields = ["lease_ref", "node__hostname"]


class PriorityClassInline(admin.TabularInline):
    model = PriorityClass
    fields = ["name", "value", "description"]
    extra = 0


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "owner", "created_at"]
    list_filter = ["kind"]
    filter_horizontal = ["nodes"]
    inlines = [PriorityClassInline]


class QuotaInline(admin.TabularInline):
    model = Quota
    fields = ["gpu_model", "nominal", "borrowing_limit", "lending_limit"]
    extra = 0


@admin.register(QuotaNode)
class QuotaNodeAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "parent", "cohort", "organization", "preempt_within_queue",
                    "shape_nodes"]
    list_filter = ["pool"]
    search_fields = ["name", "pool__name", "organization__slug"]
    list_select_related = ["pool", "parent", "organization"]
    inlines = [QuotaInline]


@admin.register(TidalStep)
class TidalStepAdmin(admin.ModelAdmin):
    list_display = ["name", "pool", "daily_at", "at"]
    list_filter = ["pool"]
    list_select_related = ["pool"]


@admin.register(TidalRun)
class TidalRunAdmin(admin.ModelAdmin):
    """Applied steps are history: read only."""

    list_display = ["step", "due_at", "started_at", "in_force_at", "gpus_to_give_way",
                    "leases_preempted"]
    list_select_related = ["step"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

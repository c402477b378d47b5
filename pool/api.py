"""REST API for the pool: nodes (providers), heartbeats (node agents), GPUs, GPU models,
pools and their quotas."""

import time

import django_filters
from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import AuthenticationFailed, NotFound, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from ibex.accounts.api import StrictSerializer
from ibex.accounts.models import Organization
from ibex.accounts.permissions import ReadOrProvide, organization_of
from ibex.api.errors import ApiError
from ibex.api.throttles import HeartbeatThrottle, NodeLogsThrottle
from pool import quotas, services, workloads
from pool.core import quotas as core
from pool.core.workloads import RANK_STATES
from pool.models import Gpu, GpuModel, Node, Pool, PriorityClass, TidalRun

MAX_BULK_NODES = 1000


# --- serializers ------------------------------------------------------------------------------


class GpuModelSerializer(serializers.ModelSerializer):
    class Meta:
        model = GpuModel
        fields = ["name", "vendor", "architecture", "memory_mib", "bf16_tflops", "mig_capable",
                  "mig_profiles"]


class NodeGpuSerializer(serializers.ModelSerializer):
    gpu_model = serializers.CharField(source="gpu_model.name")

    class Meta:
        model = Gpu
        fields = ["id", "index", "uuid", "gpu_model", "memory_mib", "mig_capable",
                  "shareable", "nvlink_domain", "health"]


class NodeSerializer(serializers.ModelSerializer):
    fabric = serializers.CharField(source="fabric.name")
    gpu_model = serializers.CharField(source="gpu_model.name")
    gpus = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = ["id", "hostname", "fabric", "gpu_model", "cpu_cores", "memory_gib", "os",
                  "driver_version", "state", "drain_mode", "health", "heartbeat_interval_s",
                  "last_heartbeat_at", "inventory_mismatch", "created_at", "gpus"]

    @extend_schema_field(NodeGpuSerializer(many=True))
    def get_gpus(self, node) -> list[dict]:
        gpus = self.context.get("gpus")
        return NodeGpuSerializer(node.gpus.all() if gpus is None else gpus, many=True).data


class DrainSerializer(StrictSerializer):
    mode = serializers.ChoiceField(
        choices=Node.DrainMode.choices, default=Node.DrainMode.RUN_TO_END,
        help_text="move: leases whose tenant allowed moves are moved off at the scheduler's next "
                  "pass; run_to_end: they finish here. Either way no new lease comes.")
    reason = serializers.CharField(max_length=200, required=False, default="drained",
                                   help_text="why, kept in the node's history and the audit log")


class RegisteredNodeSerializer(NodeSerializer):
    token = serializers.CharField(help_text="the node agent's token, shown only once")

    class Meta(NodeSerializer.Meta):
        fields = [*NodeSerializer.Meta.fields, "token"]


class GpuDescriptionSerializer(StrictSerializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    uuid = serializers.CharField(max_length=80, required=False, default="")
    memory_mib = serializers.IntegerField(min_value=1, max_value=4_000_000, required=False)
    nvlink_domain = serializers.CharField(max_length=80, required=False, default="")


class NodeCreateSerializer(StrictSerializer):
    hostname = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
    fabric = serializers.CharField(max_length=100, help_text="the fabric's id or name")
    gpu_model = serializers.CharField(max_length=40)
    gpu_count = serializers.IntegerField(min_value=1, max_value=64)
    cpu_cores = serializers.IntegerField(min_value=1, max_value=4096)
    memory_gib = serializers.IntegerField(min_value=1, max_value=1_048_576)
    os = serializers.CharField(max_length=100, required=False, default="")
    driver_version = serializers.CharField(max_length=50, required=False, default="")
    gpus = GpuDescriptionSerializer(many=True, required=False, default=list)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        indexes = [g["index"] for g in attrs["gpus"]]
        if len(set(indexes)) != len(indexes) or any(i >= attrs["gpu_count"] for i in indexes):
            raise serializers.ValidationError(
                {"gpus": ["GPU indexes must be distinct and below gpu_count."]})
        return attrs

    def to_spec(self) -> services.NodeSpec:
        data = dict(self.validated_data)
        data["gpus"] = tuple(data["gpus"])
        return services.NodeSpec(**data)


class NodeUpdateSerializer(StrictSerializer):
    """What a provider may correct (PATCH); fabric and hostname are named only to be refused
    clearly."""

    cpu_cores = serializers.IntegerField(min_value=1, max_value=4096, required=False)
    memory_gib = serializers.IntegerField(min_value=1, max_value=1_048_576, required=False)
    os = serializers.CharField(max_length=100, required=False, allow_blank=True)
    driver_version = serializers.CharField(max_length=50, required=False, allow_blank=True)
    gpu_model = serializers.CharField(max_length=40, required=False)
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, required=False)
    fabric = serializers.CharField(required=False)
    hostname = serializers.CharField(required=False)


class BulkNodeCreateSerializer(StrictSerializer):
    nodes = NodeCreateSerializer(many=True, allow_empty=False, max_length=MAX_BULK_NODES)


class BulkRegisteredSerializer(serializers.Serializer):
    nodes = RegisteredNodeSerializer(many=True)


class TokenSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    token = serializers.CharField()


class GpuReportSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    temperature_c = serializers.IntegerField(min_value=-50, max_value=200, default=0)
    utilization_pct = serializers.IntegerField(min_value=0, max_value=100, default=0)
    memory_used_mib = serializers.IntegerField(min_value=0, default=0)
    ecc_errors = serializers.IntegerField(min_value=0, default=0)
    xid_errors = serializers.IntegerField(min_value=0, default=0)


class IbPortReportSerializer(serializers.Serializer):
    port = serializers.IntegerField(min_value=0, max_value=255)
    state = serializers.CharField(max_length=20)
    rate_gbps = serializers.FloatField(min_value=0, required=False)


class HeartbeatSerializer(serializers.Serializer):
    gpus = GpuReportSerializer(many=True, max_length=64)
    ib_ports = IbPortReportSerializer(many=True, required=False, default=list, max_length=64)
    serving = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                    default=list, max_length=256)


class RuntimeReportSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(choices=Node.Runtime.values)
    address = serializers.CharField(max_length=253, required=False, allow_blank=True)
    ssh_port = serializers.IntegerField(min_value=1, max_value=65535, required=False,
                                        allow_null=True)


class WorkloadReportSerializer(serializers.Serializer):
    lease = serializers.CharField(max_length=64)
    generation = serializers.IntegerField(min_value=0)
    state = serializers.ChoiceField(choices=RANK_STATES)
    exit_code = serializers.IntegerField(required=False, allow_null=True)
    started_at = serializers.DateTimeField(required=False, allow_null=True)
    ended_at = serializers.DateTimeField(required=False, allow_null=True)
    master_port = serializers.IntegerField(min_value=1, max_value=65535, required=False,
                                           allow_null=True)
    error = serializers.CharField(max_length=500, required=False, allow_blank=True)


class PartDeviceSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    mig_profile = serializers.CharField(max_length=20, required=False)
    start = serializers.IntegerField(min_value=0, max_value=7, required=False)
    share = serializers.IntegerField(min_value=1, max_value=999, required=False)
    memory_mib = serializers.IntegerField(min_value=0, required=False)
    uuid = serializers.CharField(max_length=100, required=False, allow_blank=True)
    enforced = serializers.BooleanField()
    error = serializers.CharField(max_length=500, required=False, allow_blank=True)


class HeartbeatWithWorkSerializer(HeartbeatSerializer):
    devices = serializers.DictField(
        child=PartDeviceSerializer(many=True), required=False,
        help_text="per lease of parts it serves: what the agent made of each part (a MIG "
                  "device, MPS limits) and whether it is enforced")
    runtime = RuntimeReportSerializer(required=False)
    workloads = WorkloadReportSerializer(many=True, required=False, max_length=256)
    wait_s = serializers.FloatField(min_value=0, max_value=300, required=False,
                                    help_text="hold the answer this long (at most the server's "
                                              "HEARTBEAT_MAX_WAIT_S) until there is work")


class LogShipmentSerializer(StrictSerializer):
    lease = serializers.CharField(max_length=64)
    generation = serializers.IntegerField(min_value=0)
    from_line = serializers.IntegerField(min_value=0)
    lines = serializers.ListField(child=serializers.CharField(
        max_length=workloads.LINE_MAX_BYTES, allow_blank=True, trim_whitespace=False),
        max_length=100_000)


class LogShipmentAnswerSerializer(serializers.Serializer):
    next_line = serializers.IntegerField()


class HeartbeatAnswerSerializer(serializers.Serializer):
    interval_s = serializers.IntegerField()
    node_state = serializers.CharField()
    actions = serializers.ListField(child=serializers.DictField())


class OfferedGpuSerializer(serializers.ModelSerializer):
    """What a tenant sees of a GPU: no host name, no GUID."""

    gpu_model = serializers.CharField(source="gpu_model.name")
    fabric = serializers.IntegerField(source="node.fabric_id")
    leaf = serializers.CharField(source="node.host.leaf")

    class Meta:
        model = Gpu
        fields = ["id", "gpu_model", "memory_mib", "mig_capable", "shareable", "health",
                  "fabric", "leaf"]


class ProviderGpuSerializer(OfferedGpuSerializer):
    hostname = serializers.CharField(source="node.hostname")
    node = serializers.IntegerField(source="node.id")
    node_state = serializers.CharField(source="node.state")

    class Meta(OfferedGpuSerializer.Meta):
        fields = [*OfferedGpuSerializer.Meta.fields, "node", "hostname", "index", "uuid",
                  "node_state"]


# --- views --------------------------------------------------------------------------------------


class NodeViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = NodeSerializer
    permission_classes = [ReadOrProvide]
    filterset_fields = ["hostname", "state", "health"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Node.objects.none()
        org = organization_of(self.request)
        nodes = Node.objects.select_related("fabric", "gpu_model").prefetch_related(
            Prefetch("gpus", queryset=Gpu.objects.select_related("gpu_model")))
        return nodes if org.is_operator else nodes.filter(provider=org)

    def _register(self, specs):
        registered = services.register_nodes(provider=organization_of(self.request),
                                             specs=specs)
        # Built from the created rows: no query per node, so 1,000 nodes answer quickly.
        return [{**NodeSerializer(r.node, context={"gpus": r.gpus}).data, "token": r.token}
                for r in registered]

    @extend_schema(request=NodeCreateSerializer, responses={201: RegisteredNodeSerializer},
                   summary="Register a node on one of your fabric's hosts")
    def create(self, request):
        form = NodeCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        return Response(self._register([form.to_spec()])[0], status=status.HTTP_201_CREATED)

    @extend_schema(request=NodeUpdateSerializer, responses=NodeSerializer,
                   summary="Correct a node's description (its owner only)")
    def partial_update(self, request, pk=None):
        node = self.get_object()
        if node.provider_id != organization_of(request).pk:
            raise PermissionDenied("Only the node's provider corrects it.")
        form = NodeUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.update_node(node=node, actor=request.user.get_username(),
                             changes=dict(form.validated_data))
        return Response(NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=BulkNodeCreateSerializer, responses={201: BulkRegisteredSerializer},
                   summary="Register up to 1,000 nodes at once, all or nothing")
    @action(detail=False, methods=["post"])
    def bulk(self, request):
        form = BulkNodeCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        specs = [NodeCreateSerializer(data=item) for item in request.data["nodes"]]
        for spec in specs:
            spec.is_valid(raise_exception=True)
        return Response({"nodes": self._register([s.to_spec() for s in specs])},
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=DrainSerializer, responses=NodeSerializer,
                   summary="Drain: take no new leases; move the running ones or let them end")
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        node = self.get_object()
        form = DrainSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        services.drain_node(node=node, actor=request.user.get_username(),
                            mode=form.validated_data["mode"],
                            reason=form.validated_data["reason"])
        return Response(NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses=TokenSerializer,
                   summary="Issue a new agent token (the old one stops working)")
    @action(detail=True, methods=["post"], url_path="rotate-token")
    def rotate_token(self, request, pk=None):
        node = self.get_object()
        return Response({"id": node.pk, "token": services.rotate_node_token(node=node)})


GPU_COUNTERS = {"temperature_c": (-50, 200), "utilization_pct": (0, 100),
                "memory_used_mib": (0, 10_000_000), "ecc_errors": (0, 10**9),
                "xid_errors": (0, 10**9)}


def _whole(value, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise serializers.ValidationError({field: [f"Must be a whole number from {low} to {high}."]})
    return value


def parse_heartbeat(data) -> dict:
    """Validate a heartbeat by hand: it is the hottest endpoint (the serializer above documents
    the same shape for the schema)."""
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    unknown = set(data) - {"gpus", "ib_ports", "serving", "runtime", "workloads", "wait_s",
                           "devices"}
    if unknown:
        raise serializers.ValidationError({name: ["Unknown field."] for name in sorted(unknown)})
    gpus = data.get("gpus")
    if not isinstance(gpus, list) or len(gpus) > 64:
        raise serializers.ValidationError({"gpus": ["Expected a list of at most 64 GPUs."]})
    parsed = []
    for position, gpu in enumerate(gpus):
        where = f"gpus.{position}."
        if not isinstance(gpu, dict) or set(gpu) - {"index", *GPU_COUNTERS}:
            raise serializers.ValidationError({where[:-1]: ["Unexpected shape or field."]})
        item = {"index": _whole(gpu.get("index"), where + "index", 0, 63)}
        for name, (low, high) in GPU_COUNTERS.items():
            item[name] = _whole(gpu.get(name, 0), where + name, low, high)
        parsed.append(item)
    ports = data.get("ib_ports", [])
    if not isinstance(ports, list) or len(ports) > 64 or not all(
            isinstance(p, dict) and isinstance(p.get("port"), int) and isinstance(p.get("state"), str)
            for p in ports):
        raise serializers.ValidationError({"ib_ports": ["Expected [{port, state, rate_gbps}]."]})
    serving = data.get("serving", [])
    if not isinstance(serving, list) or len(serving) > 256 or not all(
            isinstance(ref, str) and 0 < len(ref) <= 64 for ref in serving):
        raise serializers.ValidationError({"serving": ["Expected a list of lease ids."]})
    parsed = {"gpus": parsed, "ib_ports": ports, "serving": serving}
    if data.get("runtime") is not None or data.get("workloads") or "wait_s" in data:
        parsed.update(_parse_work(data))
    if data.get("devices"):
        parsed["devices_reported"] = _parse_devices(data["devices"])
    return parsed


def _parse_devices(devices) -> dict[str, list[dict]]:
    """What the agent made of the parts it serves (docs/workloads.md, "Parts of GPUs")."""
    if not isinstance(devices, dict) or len(devices) > 256 or not all(
            isinstance(ref, str) and 0 < len(ref) <= 64 for ref in devices):
        raise serializers.ValidationError({"devices": ["Expected {lease id: [device]}."]})
    parsed = {}
    for ref, made in devices.items():
        form = PartDeviceSerializer(data=made, many=True)
        if not isinstance(made, list) or len(made) > 64 or not form.is_valid():
            raise serializers.ValidationError({f"devices.{ref}": [
                "Expected a list of at most 64 {index, enforced, ...}."]})
        parsed[ref] = [dict(item) for item in form.validated_data]
    return parsed


def _parse_work(data: dict) -> dict:
    """The workload part of a heartbeat (docs/workloads.md): rare enough for a serializer."""
    work = HeartbeatWithWorkSerializer(data={
        "gpus": [], **{k: data[k] for k in ("runtime", "workloads", "wait_s") if k in data}})
    work.is_valid(raise_exception=True)
    runtime = work.validated_data.get("runtime")
    if runtime and runtime.get("ssh_port") and runtime["kind"] != Node.Runtime.SSH:
        raise serializers.ValidationError({"runtime.ssh_port": ["Only an ssh runtime has one."]})
    if runtime and runtime["kind"] == Node.Runtime.SSH and not runtime.get("ssh_port"):
        raise serializers.ValidationError({"runtime.ssh_port": ["An ssh runtime needs its port."]})
    return {"runtime": dict(runtime) if runtime else None,
            "workloads_reported": [dict(w) for w in work.validated_data.get("workloads", [])],
            "wait_s": work.validated_data.get("wait_s", 0)}


class HeartbeatView(APIView):
    """A node agent's heartbeat: authenticated by the node's own token, not an API key."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []  # counted per node once its token is checked, in post()

    @extend_schema(request=HeartbeatWithWorkSerializer, responses=HeartbeatAnswerSerializer,
                   summary="Heartbeat from a node agent (Authorization: Node <token>)")
    def post(self, request, pk: int):
        node = _node_of(request, pk)
        throttle = HeartbeatThrottle()  # after the token, so strangers cannot use a node's allowance
        if not throttle.allow_request(request, self):
            self.throttled(request, throttle.wait())
        beat = parse_heartbeat(request.data)
        wait_s = beat.pop("wait_s", 0)
        held_until = time.monotonic() + wait_s
        if wait_s:  # (a Redis call only for the heartbeats that may be held)
            workloads.forget_wakes(node.pk)
        answer = services.record_heartbeat(node=node, **beat)
        # held until there is something to do (a wake may bring nothing for this node: hold on)
        while not answer.actions and workloads.wait_for_work(node.pk,
                                                             held_until - time.monotonic()):
            answer = services.heartbeat_answer(node=services.node_to_answer(node.pk),
                                               serving=beat["serving"])
        return Response({"interval_s": answer.interval_s, "node_state": answer.node_state,
                         "actions": answer.actions})

    def get_authenticate_header(self, request):
        return "Node"


def parse_log_shipment(data) -> dict:
    """Validate a log shipment by hand: a second's output of a busy rank is thousands of lines,
    which a serializer field per line makes the web's main cost (LogShipmentSerializer above
    documents the same shape for the schema)."""
    if not isinstance(data, dict):
        raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    unknown = set(data) - {"lease", "generation", "from_line", "lines"}
    if unknown:
        raise serializers.ValidationError({name: ["Unknown field."] for name in sorted(unknown)})
    lease = data.get("lease")
    if not isinstance(lease, str) or not 0 < len(lease) <= 64:
        raise serializers.ValidationError({"lease": ["Expected the lease's reference, e.g. L-42."]})
    lines = data.get("lines")
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise serializers.ValidationError({"lines": ["Expected a list of strings."]})
    sizes = [len(line.encode()) for line in lines]
    if sum(sizes) > workloads.REQUEST_MAX_BYTES or any(
            size > workloads.LINE_MAX_BYTES for size in sizes):
        raise serializers.ValidationError({"lines": [
            f"At most {workloads.REQUEST_MAX_BYTES} bytes per request and "
            f"{workloads.LINE_MAX_BYTES} per line."]})
    if any("\x00" in line for line in lines):
        raise serializers.ValidationError({"lines": ["Lines may not contain NUL characters."]})
    return {"lease": lease, "lines": lines,
            "generation": _whole(data.get("generation"), "generation", 0, 2**31 - 1),
            "from_line": _whole(data.get("from_line"), "from_line", 0, 2**62)}


class NodeLogsView(APIView):
    """A node agent ships a lease's output lines (docs/workloads.md)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []  # counted per node once its token is checked

    @extend_schema(request=LogShipmentSerializer, responses=LogShipmentAnswerSerializer,
                   summary="Output lines of a lease's command, from a node agent "
                           "(Authorization: Node <token>)")
    def post(self, request, pk: int):
        node = _node_of(request, pk)
        throttle = NodeLogsThrottle()
        if not throttle.allow_request(request, self):
            self.throttled(request, throttle.wait())
        data = parse_log_shipment(request.data)
        try:
            next_line = workloads.append_log(
                node=node, lease_ref=data["lease"], generation=data["generation"],
                from_line=data["from_line"], lines=data["lines"])
        except workloads.LogRefused as exc:
            raise NotFound(str(exc)) from None
        return Response({"next_line": next_line})

    def get_authenticate_header(self, request):
        return "Node"


def _node_of(request, pk: int) -> Node:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Node "):
        raise AuthenticationFailed("Send the node's token as 'Authorization: Node <token>'.")
    try:
        return services.authenticate_node(pk, header[5:].strip())
    except services.TokenRefused as exc:
        raise AuthenticationFailed(str(exc)) from None


class GpuFilter(django_filters.FilterSet):
    model = django_filters.CharFilter(field_name="gpu_model__name")
    health = django_filters.ChoiceFilter(choices=Gpu.Health.choices)
    state = django_filters.ChoiceFilter(field_name="node__state", choices=Node.State.choices)
    fabric = django_filters.CharFilter(field_name="node__fabric__name")
    leaf = django_filters.CharFilter(field_name="node__host__leaf")

    class Meta:
        model = Gpu
        fields = ["model", "health", "state", "fabric", "leaf"]


class GpuViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Providers see their GPUs; operators all; tenants the offered ones, without host names."""

    permission_classes = [ReadOrProvide]
    filterset_class = GpuFilter

    def _org(self):
        return organization_of(self.request)

    def get_serializer_class(self):
        if getattr(self, "swagger_fake_view", False):
            return ProviderGpuSerializer
        org = self._org()
        return ProviderGpuSerializer if (org.is_provider or org.is_operator) else OfferedGpuSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Gpu.objects.none()
        org = self._org()
        if org.is_operator:
            gpus = Gpu.objects.all()
        elif org.is_provider:
            gpus = Gpu.objects.filter(node__provider=org)
        else:
            gpus = services.offered_gpus()
        return gpus.select_related("gpu_model", "node", "node__host")


class GpuModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = GpuModelSerializer
    queryset = GpuModel.objects.all()
    permission_classes = [AllowAny]
    lookup_field = "name"
    lookup_value_regex = "[A-Za-z0-9.-]+"
    pagination_class = None


# --- pools and quotas -------------------------------------------------------------------------


class PoolCapacitySerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    gpus = serializers.IntegerField(help_text="GPUs on the pool's live nodes")
    bound = serializers.IntegerField(help_text="of those, GPUs bound to leases now")


class TidalRunSerializer(serializers.ModelSerializer):
    step = serializers.CharField(source="step.name")
    seconds_to_force = serializers.FloatField(
        allow_null=True, help_text="from the start until the new split was in force")

    class Meta:
        model = TidalRun
        fields = ["step", "due_at", "started_at", "in_force_at", "seconds_to_force",
                  "gpus_to_give_way", "leases_preempted", "notice_s"]


class PriorityClassSerializer(serializers.ModelSerializer):
    class Meta:
        model = PriorityClass
        fields = ["name", "value", "description"]


class PoolSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.slug")
    capacity = serializers.SerializerMethodField()
    tidal_runs = serializers.SerializerMethodField()
    priority_classes = PriorityClassSerializer(many=True, read_only=True,
                                               help_text="named priorities orders may give")

    class Meta:
        model = Pool
        fields = ["name", "kind", "owner", "created_at", "capacity", "priority_classes",
                  "tidal_runs"]

    @extend_schema_field(PoolCapacitySerializer(many=True))
    def get_capacity(self, pool) -> list[dict]:
        return quotas.pool_capacity(pool)

    @extend_schema_field(TidalRunSerializer(many=True))
    def get_tidal_runs(self, pool) -> list[dict]:
        """The pool's last ten tidal schedule steps applied, newest first."""
        runs = TidalRun.objects.filter(step__pool=pool).select_related("step")[:10]
        return TidalRunSerializer(runs, many=True).data


class PoolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Operators see every pool; others the pools they own or whose quota nodes name them."""

    serializer_class = PoolSerializer
    permission_classes = [ReadOrProvide]
    lookup_field = "name"
    lookup_value_regex = "[-a-zA-Z0-9_]+"

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Pool.objects.none()
        return (quotas.pools_visible_to(organization_of(self.request))
                .select_related("owner").prefetch_related("priority_classes").order_by("name"))


class QuotaSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    nominal = serializers.IntegerField()
    borrowing_limit = serializers.IntegerField(allow_null=True)
    lending_limit = serializers.IntegerField(allow_null=True)
    available_if_idle = serializers.IntegerField(
        help_text="what the node may take while nothing runs in the pool")
    used = serializers.IntegerField(help_text="GPUs its leases (or its queues') hold now")
    borrowed = serializers.IntegerField(help_text="GPUs a queue uses beyond its nominal")
    lent = serializers.IntegerField(help_text="GPUs of its idle nominal others use now")
    available_now = serializers.IntegerField(help_text="how many more it may take now")


class WaitingOrderSerializer(serializers.Serializer):
    order = serializers.IntegerField()
    gpus = serializers.IntegerField()
    priority = serializers.IntegerField()
    position = serializers.IntegerField(allow_null=True, help_text="1 = next in the pool")
    reason = serializers.CharField(allow_blank=True)


class QuotaNodeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    pool = serializers.CharField()
    name = serializers.CharField()
    parent = serializers.CharField(allow_null=True)
    cohort = serializers.CharField(allow_blank=True)
    organization = serializers.CharField(allow_null=True)
    preempt_within_queue = serializers.BooleanField()
    shape_nodes = serializers.IntegerField(allow_null=True)
    is_queue = serializers.BooleanField()
    quotas = QuotaSerializer(many=True)
    waiting = WaitingOrderSerializer(many=True)


class QuotaInputSerializer(StrictSerializer):
    gpu_model = serializers.CharField(max_length=40)
    nominal = serializers.IntegerField(min_value=0, max_value=10**7)
    borrowing_limit = serializers.IntegerField(min_value=0, max_value=10**7, required=False,
                                               allow_null=True, default=None)
    lending_limit = serializers.IntegerField(min_value=0, max_value=10**7, required=False,
                                             allow_null=True, default=None)


class QuotaNodeCreateSerializer(StrictSerializer):
    pool = serializers.SlugField(max_length=100)
    name = serializers.SlugField(max_length=100)
    parent = serializers.SlugField(max_length=100, required=False, allow_null=True, default=None)
    cohort = serializers.SlugField(max_length=100, required=False, allow_blank=True, default="")
    organization = serializers.SlugField(max_length=64, required=False, allow_null=True,
                                         default=None, help_text="whose orders count against it")
    preempt_within_queue = serializers.BooleanField(required=False, default=False)
    shape_nodes = serializers.IntegerField(
        min_value=1, max_value=10_000, required=False, allow_null=True, default=None,
        help_text="a guaranteed shape: this many whole nodes inside one leaf")
    quotas = QuotaInputSerializer(many=True, required=False, default=list, max_length=64)


class PoolQuerySerializer(serializers.Serializer):
    pool = serializers.CharField(max_length=100, error_messages={
        "blank": "Name the pool: ?pool=NAME."})


class QuotaNodeViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """A pool's quota tree: nodes, their quotas, parent and cohort. Operators define them."""

    serializer_class = QuotaNodeSerializer
    permission_classes = [ReadOrProvide]
    pagination_class = None

    def get_queryset(self):
        return Pool.objects.none()  # answers are built by pool.quotas.quota_view

    def _pool(self, name: str) -> Pool:
        pool = (quotas.pools_visible_to(organization_of(self.request))
                .filter(name=name).first())
        if pool is None:
            raise NotFound(f"No pool named {name!r}.")
        return pool

    @extend_schema(parameters=[OpenApiParameter("pool", str, required=True,
                                                description="the pool's name")],
                   responses=QuotaNodeSerializer(many=True),
                   summary="A pool's quota nodes with their quotas")
    def list(self, request):
        query = PoolQuerySerializer(data={"pool": request.query_params.get("pool", "")})
        query.is_valid(raise_exception=True)  # e.g. a NUL byte PostgreSQL would refuse: a 400
        pool = self._pool(query.validated_data["pool"])
        try:
            return Response(quotas.quota_view(pool, organization_of(request)))
        except core.QuotaError as exc:  # rows changed outside the services (the admin)
            raise ApiError(f"the quota tree of pool {pool.name} is inconsistent: {exc}",
                           code="inconsistent_quotas", status_code=409) from None

    @extend_schema(request=QuotaNodeCreateSerializer, responses={201: QuotaNodeSerializer},
                   summary="Define (create or replace) a quota node and its quotas (operators)")
    def create(self, request):
        if not organization_of(request).is_operator:
            raise PermissionDenied("Only operators define quotas.")
        form = QuotaNodeCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        pool = Pool.objects.filter(name=data["pool"]).first()
        if pool is None:
            raise serializers.ValidationError({"pool": [f"No pool named {data['pool']!r}."]})
        organization = None
        if data["organization"]:
            organization = Organization.objects.filter(slug=data["organization"]).first()
            if organization is None:
                raise serializers.ValidationError(
                    {"organization": [f"No organisation {data['organization']!r}."]})
        node = quotas.define_quota_node(
            pool=pool, name=data["name"], parent=data["parent"], cohort=data["cohort"],
            organization=organization, preempt_within_queue=data["preempt_within_queue"],
            shape_nodes=data["shape_nodes"], quotas=[quotas.QuotaSpec(**q) for q in data["quotas"]])
        view = next(v for v in quotas.quota_view(pool) if v["id"] == node.id)
        return Response(view, status=status.HTTP_201_CREATED)

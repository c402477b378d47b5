"""REST API for fabrics: list and summary, import from a file, export to Slurm topology.conf, and
the fabric agent's reports of the live fabric."""

import re

from django.db import transaction
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from fabric import selectors, services
from fabric.core import qos as qos_core
from fabric.core.fabric_report import REPORT_VERSION
from fabric.core.spec import normalise_guid
from fabric.models import (
    ERROR_THRESHOLD_DEFAULT,
    ERROR_THRESHOLD_MAX,
    PKEY_MAX,
    PKEY_MIN,
    Fabric,
    Link,
    Partition,
)
from fabric.selectors import EXPORT_FORMATS, export_topology_conf
from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrProvide, organization_of

MAX_UPLOAD_BYTES = 64 * 1024 * 1024


TENANT_FIELDS = ("id", "name", "kind", "link_rate_gbps")
TENANT_SUMMARY_KEYS = ("kind", "levels", "domain_counts", "gpus", "link_rates_gbps",
                       "oversubscription", "rail_optimised")


class PkeyRangeSerializer(StrictSerializer):
    first = serializers.CharField(max_length=10, help_text="the lowest P_Key, e.g. 0x1000")
    last = serializers.CharField(max_length=10, help_text="the highest P_Key, e.g. 0x7ffe")

    def _pkey(self, value):
        try:
            number = parse_pkey(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if not PKEY_MIN <= number <= PKEY_MAX:
            raise serializers.ValidationError("outside 0x0001-0x7ffe (0x7fff is the default "
                                              "partition; the full-member bit is OpenSM's)")
        return number

    validate_first = _pkey
    validate_last = _pkey

    def validate(self, data):
        if data["first"] > data["last"]:
            raise ValidationError({"last": ["lower than first"]})
        return data


class FabricPartitionsSerializer(serializers.Serializer):
    pkey_range = serializers.DictField(child=serializers.CharField(),
                                       help_text="{first, last}: the P_Keys leases get")
    provider_pkeys = serializers.ListField(child=serializers.CharField(), help_text=(
        "the P_Keys of your own partition lines, as the fabric agent last read them"))
    live = serializers.IntegerField(help_text="live partitions (leases on several nodes)")


class QosClassSerializer(serializers.Serializer):
    sl = serializers.IntegerField(min_value=0, max_value=15, help_text="its service level")
    vl = serializers.IntegerField(min_value=0, max_value=14, help_text="the VL its SL maps to")


class QosClassesSerializer(serializers.Serializer):
    guaranteed = QosClassSerializer()
    standard = QosClassSerializer()
    scavenger = QosClassSerializer()


class QosSettingsSerializer(serializers.Serializer):
    """A fabric's bandwidth classes as OpenSM's QoS (docs/fabric.md, "Bandwidth classes")."""

    max_vls = serializers.ChoiceField(choices=list(qos_core.MAX_VLS_CHOICES),
                                      help_text="data VLs a port uses (qos_max_vls)")
    high_limit = serializers.IntegerField(min_value=0, max_value=255, help_text=(
        "how much the high-priority table may send before the low one gets a turn; 255: "
        "no limit (qos_high_limit)"))
    classes = QosClassesSerializer()
    vlarb_high = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=255),
                                       help_text='VL → weight, high priority: {"1": 255}')
    vlarb_low = serializers.DictField(child=serializers.IntegerField(min_value=0, max_value=255),
                                      help_text='VL → weight, low priority: {"0": 64, "2": 4}')
    sl2vl = serializers.ListField(child=serializers.IntegerField(), read_only=True, help_text=(
        "the VL of each SL 0-15, from the classes (other SLs: the standard VL)"))


@extend_schema_field(QosSettingsSerializer(partial=True))
class QosChangeField(serializers.DictField):
    """The settings to change; the service checks them whole (fabric.core.qos.validate) and
    names the field it refuses (`qos.classes.scavenger.sl`)."""


class FabricUpdateSerializer(StrictSerializer):
    pkey_range = PkeyRangeSerializer(required=False, help_text=(
        "the P_Keys IBEX gives leases' partitions (default 0x1000-0x7ffe)"))
    qos = QosChangeField(required=False, help_text=(
        "the bandwidth classes' SLs, VLs and VL-arbitration weights; a key left out keeps "
        "its value"))
    guarantee_ratio = serializers.DecimalField(
        max_digits=4, decimal_places=3, required=False, help_text=(
            "guaranteed bandwidth on a link may sum to its rate × this: above 0, at most 1 "
            "(default 0.8)"))
    error_threshold = serializers.IntegerField(
        required=False, min_value=0, max_value=ERROR_THRESHOLD_MAX, help_text=(
            "errors per minute on a link (SymbolErrorCounter, PortRcvErrors, "
            f"LinkDownedCounter of both ends) above which it is faulty (default "
            f"{ERROR_THRESHOLD_DEFAULT})"))

    def validate_guarantee_ratio(self, value):
        if not 0 < value <= 1:
            raise serializers.ValidationError("above 0 and at most 1 (default 0.8)")
        return value

    def validate(self, data):
        if not data:
            raise ValidationError({"non_field_errors": [
                "nothing to change: give pkey_range, qos, guarantee_ratio or error_threshold"]})
        return data


class FabricHealthTierSerializer(serializers.Serializer):
    tier = serializers.CharField(help_text="host-leaf, leaf-spine, spine-core, ...")
    links = serializers.IntegerField()
    down = serializers.IntegerField()
    erring = serializers.IntegerField(help_text="links above the error threshold")
    errors_per_minute = serializers.FloatField()
    traffic_gbps = serializers.FloatField(help_text="both directions, over the last interval")
    capacity_gbps = serializers.FloatField(help_text="both directions of the links measured")
    utilisation = serializers.FloatField(allow_null=True, help_text="traffic / capacity, 0-1")


class FabricFaultSerializer(serializers.Serializer):
    kind = serializers.CharField(help_text="down or errors")
    name = serializers.CharField(help_text="the link: `leaf01 port 5 - spine01 port 1`")
    detail = serializers.CharField()
    started_at = serializers.DateTimeField()


class FabricHealthSerializer(serializers.Serializer):
    sampled_at = serializers.DateTimeField(allow_null=True,
                                           help_text="the fabric agent's last reading")
    error_threshold = serializers.IntegerField(help_text="errors per minute on a link")
    tiers = FabricHealthTierSerializer(many=True)
    faults = FabricFaultSerializer(many=True, help_text="links down or erring now")


class FabricSerializer(serializers.ModelSerializer):
    owner = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    partitions = serializers.SerializerMethodField()
    health = serializers.SerializerMethodField()
    qos = serializers.SerializerMethodField()
    link_rate_gbps = serializers.DecimalField(max_digits=7, decimal_places=1, read_only=True,
                                              allow_null=True)

    class Meta:
        model = Fabric
        fields = ["id", "name", "owner", "kind", "link_rate_gbps", "source", "summary",
                  "guarantee_ratio",
                  "gateway", "gateway_status", "gateway_seen_at", "agent_seen_at",
                  "agent_reachable", "agent_error", "live_seen_at", "live_summary",
                  "partitions", "qos", "error_threshold", "health", "created_at",
                  "updated_at"]
        read_only_fields = fields

    @extend_schema_field(FabricPartitionsSerializer)
    def get_partitions(self, fabric) -> dict:
        """A P_Key per lease on several nodes (docs/fabric.md, "Partitions")."""
        return {"pkey_range": {"first": f"{fabric.pkey_first:#06x}",
                               "last": f"{fabric.pkey_last:#06x}"},
                "provider_pkeys": [f"{key:#06x}" for key in fabric.provider_pkeys or []],
                "live": fabric.live_partitions if hasattr(fabric, "live_partitions")
                else fabric.partitions.filter(released_at__isnull=True).count()}

    @extend_schema_field(QosSettingsSerializer)
    def get_qos(self, fabric) -> dict:
        """The bandwidth classes' SLs and VLs and the VL-arbitration weights, IBEX's defaults
        where the provider set none."""
        settings = qos_core.settings_of(fabric.qos)
        return {**settings, "sl2vl": qos_core.sl2vl(settings)}
    @extend_schema_field(FabricHealthSerializer(allow_null=True))
    def get_health(self, fabric) -> dict | None:
        """Links down and erring, errors and utilisation per tier, from the stored counters
        (docs/fabric.md, "Measured bandwidth and health"); in a single fabric's JSON only (null
        in the list)."""
        viewer = self.context.get("organization")
        if not self.context.get("with_health") or viewer is None or not (
                viewer.is_operator or fabric.owner_id == viewer.id):
            return None  # the owner's and the operators' (a tenant's view drops it anyway)
        return FabricHealthSerializer(selectors.fabric_health(fabric)).data

    def to_representation(self, fabric):
        data = super().to_representation(fabric)
        viewer = self.context.get("organization")
        if viewer is None or viewer.is_operator or fabric.owner_id == viewer.id:
            return data
        # A tenant leasing on the fabric sees its levels and counts: never GUIDs, host or
        # switch names (the summary's uplink maps name domains), nor the owner.
        summary = {key: data["summary"][key] for key in TENANT_SUMMARY_KEYS
                   if key in data["summary"]}
        return {**{key: data[key] for key in TENANT_FIELDS}, "summary": summary}


class FabricImportSerializer(serializers.Serializer):
    file = serializers.FileField()
    format = serializers.ChoiceField(choices=services.FORMATS)
    name = serializers.SlugField(max_length=100)
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, default=8)

    def validate_file(self, upload):
        if upload.size > MAX_UPLOAD_BYTES:
            raise serializers.ValidationError(f"larger than {MAX_UPLOAD_BYTES} bytes")
        return upload


def visible_fabrics(organization) -> QuerySet[Fabric]:
    """Operators see every fabric; providers their own; tenants those they lease on."""
    live = (Partition.objects.filter(fabric=OuterRef("pk"), released_at__isnull=True)
            .order_by().values("fabric").annotate(count=Count("pk")).values("count"))
    fabrics = Fabric.objects.select_related("owner").annotate(
        live_partitions=Coalesce(Subquery(live), 0))
    if organization.is_operator:
        return fabrics
    # The lease lookup goes by relation names only: fabric imports nothing from the market.
    leased = Q(nodes__gpus__allocations__lease__tenant=organization)
    return fabrics.filter(Q(owner=organization) | leased).distinct()


class FabricViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = FabricSerializer
    permission_classes = [ReadOrProvide]
    filterset_fields = ["kind", "source"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no caller
            return Fabric.objects.none()
        return visible_fabrics(organization_of(self.request))

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if not getattr(self, "swagger_fake_view", False):
            context["organization"] = organization_of(self.request)
            context["with_health"] = self.action in ("retrieve", "partial_update")
        return context

    @extend_schema(request={"multipart/form-data": FabricImportSerializer},
                   responses={200: FabricSerializer, 201: FabricSerializer})
    @action(detail=False, methods=["post"], url_path="import",
            parser_classes=[MultiPartParser, FormParser])
    def import_file(self, request):
        organization = organization_of(request)
        if not (organization.is_provider or organization.is_operator):
            raise PermissionDenied("Only providers and operators import fabrics.")
        form = FabricImportSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        upload = form.validated_data["file"]
        try:
            text = upload.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError({"file": ["not a UTF-8 text file"]}) from None
        result = services.import_fabric_file(
            owner=organization, name=form.validated_data["name"], text=text,
            fmt=form.validated_data["format"], path=upload.name,
            gpus_per_node=form.validated_data["gpus_per_node"],
        )
        return Response(FabricSerializer(result.fabric).data,
                        status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)

    @extend_schema(request=FabricUpdateSerializer, responses=FabricSerializer,
                   summary="Set the fabric's P_Key range, bandwidth classes' QoS, guarantee "
                           "ratio or link error threshold")
    def partial_update(self, request, pk=None):
        fabric = self.get_object()
        viewer = organization_of(request)
        if fabric.owner_id != viewer.id:
            raise NotFound()  # a tenant leasing on it sees it, but it is not theirs to change
        form = FabricUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        with transaction.atomic():  # all or nothing
            if "qos" in form.validated_data:
                fabric = services.set_qos(fabric=fabric, change=form.validated_data["qos"])
            fabric = services.update_fabric_settings(
                fabric=fabric, pkey_range=form.validated_data.get("pkey_range"),
                error_threshold=form.validated_data.get("error_threshold"))
            if "guarantee_ratio" in form.validated_data:
                fabric = services.set_guarantee_ratio(
                    fabric=fabric, ratio=form.validated_data["guarantee_ratio"])
        return Response(FabricSerializer(fabric, context=self.get_serializer_context()).data)

    @extend_schema(
        summary="The fabric as a Slurm topology.conf (tree or block)",
        operation_id="fabrics_topology_conf",
        parameters=[OpenApiParameter("format", str, enum=list(EXPORT_FORMATS),
                                     default="slurm-tree")],
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def topology_conf(self, request, pk=None):
        # Mapped by hand in urls.py: the path ends in `topology.conf`, with no slash.
        fabric = self.get_object()
        viewer = organization_of(request)
        if not (viewer.is_operator or fabric.owner_id == viewer.id):
            raise NotFound()  # host names are the owner's: a tenant gets no topology.conf
        fmt = request.query_params.get("format", "slurm-tree")
        if fmt not in EXPORT_FORMATS:
            raise ValidationError({"format": [f"use one of {', '.join(EXPORT_FORMATS)}"]})
        return Response(export_topology_conf(fabric, fmt), content_type="text/plain")


# --- the fabric agent's reports -----------------------------------------------------------------

MAX_COUNTER = 2**63 - 1  # perfquery's 64-bit counters, as PostgreSQL's bigint holds them


class GuidField(serializers.CharField):
    """A node GUID as ibnetdiscover prints it, normalised as the importer stores it."""

    def __init__(self, **kwargs):
        super().__init__(max_length=40, **kwargs)

    def to_internal_value(self, data):
        text = super().to_internal_value(data)
        try:
            guid = normalise_guid(text)
        except ValueError:
            raise serializers.ValidationError("not a GUID (hex digits, 0x...)") from None
        if len(guid) > 18:
            raise serializers.ValidationError("longer than 64 bits")
        return guid


def parse_pkey(value) -> int:
    """`"0x1a2b"` (or an integer) -> 0x1a2b; ValueError when it is not a P_Key of 15 bits."""
    if isinstance(value, bool):
        raise ValueError("not a P_Key")
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().lower()
        if not text.startswith("0x") or len(text) > 6:
            raise ValueError("write it in hex, 0x0001 to 0x7ffe")
        try:
            number = int(text, 16)
        except ValueError:
            raise ValueError("write it in hex, 0x0001 to 0x7ffe") from None
    if not 0 <= number <= 0xFFFF:
        raise ValueError("a P_Key has 16 bits")
    return number


@extend_schema_field({"type": "string", "pattern": "^0x[0-9a-fA-F]{1,4}$", "example": "0x1a2b"})
class PkeyField(serializers.Field):
    """A P_Key written in hex (`"0x1a2b"`); the full-member bit is dropped (0x9001 is 0x1001)."""

    def to_internal_value(self, data):
        try:
            return parse_pkey(data) & 0x7FFF
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value):
        return f"{value:#06x}"


class LinkEndSerializer(StrictSerializer):
    guid = GuidField()
    port = serializers.IntegerField(min_value=0, max_value=255)


class ReportNodeSerializer(StrictSerializer):
    guid = GuidField()
    kind = serializers.ChoiceField(choices=["switch", "ca", "router"])
    ports = serializers.IntegerField(min_value=1, max_value=255)
    description = serializers.CharField(max_length=200, allow_blank=True, default="")
    lid = serializers.IntegerField(min_value=0, max_value=0xFFFF, default=0)


class ReportLinkSerializer(StrictSerializer):
    a = LinkEndSerializer()
    b = LinkEndSerializer()
    state = serializers.ChoiceField(choices=Link.State.choices)
    rate_gbps = serializers.FloatField(min_value=0, max_value=100_000, allow_null=True,
                                       required=False, default=None)
    width = serializers.CharField(max_length=4, allow_blank=True, required=False, default="")


class ReportCountersSerializer(StrictSerializer):
    guid = GuidField()
    port = serializers.IntegerField(min_value=0, max_value=255)
    extended = serializers.BooleanField(default=False,
                                        help_text="data counters are perfquery -x's 64-bit ones")
    xmit_data = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER,
                                         help_text="PortXmitData, 4-byte words")
    rcv_data = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER,
                                        help_text="PortRcvData, 4-byte words")
    symbol_errors = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER)
    link_downed = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER)
    rcv_errors = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER)
    xmit_discards = serializers.IntegerField(min_value=0, max_value=MAX_COUNTER)


class SubnetManagerSerializer(StrictSerializer):
    conf_dir = serializers.CharField(max_length=500, allow_blank=True, default="")
    running = serializers.BooleanField(required=False, allow_null=True, default=None)
    pid = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


MAX_ROUTE_ENTRIES = 50_000
HEX_TABLE = re.compile(r"^(?:[0-9a-f]{2}){0,65536}$")


class ReportRoutesSerializer(StrictSerializer):
    lids = serializers.DictField(child=serializers.IntegerField(min_value=1, max_value=0xBFFF),
                                 help_text="node GUID -> its LID")
    switches = serializers.DictField(
        child=serializers.CharField(max_length=131_072, allow_blank=True),
        help_text="switch GUID -> its unicast forwarding table: two hex digits a LID from LID "
                  "0, the out port (ff: no route)")

    def _guids(self, mapping: dict) -> dict:
        if len(mapping) > MAX_ROUTE_ENTRIES:
            raise serializers.ValidationError(f"more than {MAX_ROUTE_ENTRIES} entries")
        out = {}
        for key, value in mapping.items():
            try:
                out[normalise_guid(key)] = value
            except ValueError:
                raise serializers.ValidationError(f"{key[:40]!r} is not a GUID") from None
        return out

    def validate_lids(self, lids):
        return self._guids(lids)

    def validate_switches(self, switches):
        for guid, table in switches.items():
            if not HEX_TABLE.match(table):
                raise serializers.ValidationError(f"{guid[:40]}: two lower-case hex digits a LID")
        return self._guids(switches)


class FabricReportSerializer(StrictSerializer):
    """One poll of `ibex-agent fabric` (docs/fabric.md): version 1."""

    version = serializers.ChoiceField(choices=[REPORT_VERSION])
    observed_at = serializers.DateTimeField(help_text="when the poll started (the agent's clock)")
    reachable = serializers.BooleanField(help_text="false: the agent could not read the fabric")
    error = serializers.CharField(max_length=500, allow_blank=True, default="")
    poll_s = serializers.FloatField(min_value=0, required=False, default=None)
    topology_hash = serializers.CharField(max_length=80, allow_blank=True, default="")
    nodes = ReportNodeSerializer(many=True, required=False, max_length=50_000)
    links = ReportLinkSerializer(many=True, required=False, max_length=200_000)
    counters = ReportCountersSerializer(many=True, required=False, max_length=400_000)
    counter_errors = serializers.ListField(child=serializers.CharField(max_length=500),
                                           required=False, default=list, max_length=20)
    state_error = serializers.CharField(max_length=500, allow_blank=True, required=False,
                                        default="", help_text="why ports' logical states were "
                                        "not read (every cable seen then counts as active)")
    subnet_manager = SubnetManagerSerializer(required=False)
    routes_hash = serializers.CharField(max_length=80, allow_blank=True, default="")
    routes = ReportRoutesSerializer(required=False, help_text=(
        "every switch's forwarding table and every node's LID: sent when routes_hash differs "
        "from the server's"))
    routes_error = serializers.CharField(max_length=500, allow_blank=True, required=False,
                                         default="", help_text="why routes were not read")
    provider_pkeys = serializers.ListField(
        child=PkeyField(), required=False, max_length=4096,
        help_text="the P_Keys of the provider's own lines in partitions.conf (outside IBEX's "
                  "block): IBEX gives them to no lease")

    def validate(self, data):
        if not data["reachable"]:
            for name in ("nodes", "links", "counters", "routes"):
                if name in data:
                    raise ValidationError({name: ["an unreachable poll carries no readings"]})
            if not data["error"]:
                raise ValidationError({"error": ["say why the fabric was not reachable"]})
            return data
        if not data["topology_hash"]:
            raise ValidationError({"topology_hash": ["required when the fabric was reachable"]})
        if "routes" in data and not data["routes_hash"]:
            raise ValidationError({"routes_hash": ["required with routes"]})
        if ("links" in data) != ("nodes" in data):
            raise ValidationError({"links" if "nodes" in data else "nodes":
                                   ["nodes and links come together (the topology)"]})
        seen: set = set()
        for index, link in enumerate(data.get("links", [])):
            ends = ((link["a"]["guid"], link["a"]["port"]), (link["b"]["guid"], link["b"]["port"]))
            if ends[0] == ends[1] or ends[0] in seen or ends[1] in seen:
                raise ValidationError({f"links.{index}": ["a port is on one link only"]})
            seen.update(ends)
        return data


class PartitionMemberSerializer(serializers.Serializer):
    guid = serializers.CharField(help_text="the HCA's node GUID")
    port = serializers.IntegerField()


class PartitionSerializer(serializers.Serializer):
    pkey = serializers.CharField(help_text="15 bits, `0x1a2b`: write it with the full-member "
                                           "ports")
    lease = serializers.CharField(help_text="the lease it isolates, e.g. L-12")
    members = PartitionMemberSerializer(many=True, help_text="every HCA port of the lease's "
                                                             "nodes: full members")


class QosPkeySerializer(serializers.Serializer):
    pkey = serializers.CharField(help_text="a live partition's P_Key, `0x1a2b`")
    sl = serializers.IntegerField(help_text="its lease's class's SL")
    # `class` is a Python keyword: the field is named in the constructor
    vars()["class"] = serializers.CharField(help_text="its lease's bandwidth class")


class QosAnswerSerializer(serializers.Serializer):
    options = serializers.DictField(child=serializers.CharField(), help_text=(
        "opensm.conf's QoS options (qos, qos_max_vls, qos_high_limit, qos_vlarb_high, "
        "qos_vlarb_low, qos_sl2vl)"))
    default_sl = serializers.IntegerField(help_text="the standard class's SL: every other path")
    pkeys = QosPkeySerializer(many=True)


class FabricReportAnswerSerializer(serializers.Serializer):
    fabric = serializers.CharField()
    reachable = serializers.BooleanField()
    topology_hash = serializers.CharField(help_text="the topology IBEX holds: send yours when "
                                                    "it differs")
    links = serializers.DictField(child=serializers.IntegerField(), help_text="links per state")
    changed = serializers.ListField(child=serializers.DictField(),
                                    help_text="links whose state this report changed")
    unmatched_links = serializers.IntegerField(help_text="cables up that IBEX does not know")
    partial_view = serializers.BooleanField(
        help_text="the last topology held fewer than half the known links: those it did not "
                  "reach kept their state")
    counters = serializers.DictField(child=serializers.IntegerField())
    routes_hash = serializers.CharField(allow_blank=True, help_text=(
        "the routes IBEX holds: send yours when it differs"))
    routes_changed = serializers.BooleanField(help_text="this report changed the routes held")
    partitions = PartitionSerializer(many=True, help_text=(
        "the fabric's live partitions, one per lease on several nodes: what IBEX's block of "
        "partitions.conf holds"))
    qos = QosAnswerSerializer(help_text=(
        "the bandwidth classes: the QoS options of opensm.conf and each partition's SL "
        "(qos-policy.conf)"))


class FabricReportView(APIView):
    """`ibex-agent fabric` reports what it read of the live fabric; IBEX's fabric follows."""

    permission_classes = [ReadOrProvide]

    @extend_schema(request=FabricReportSerializer, responses=FabricReportAnswerSerializer,
                   summary="The fabric agent reports the live fabric: links, states, counters",
                   operation_id="fabrics_reports_create")
    def post(self, request, name):
        provider = organization_of(request)
        if not provider.is_provider:
            raise PermissionDenied("Only providers run fabric agents.")
        if not Fabric.objects.filter(name=name, owner=provider).exists():
            # another provider's fabric is as unknown as a missing one, whatever the body says
            raise NotFound(f"You have no fabric {name!r}: import it first.")
        form = FabricReportSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        answer = services.record_fabric_report(provider=provider, fabric_name=name,
                                               report=form.validated_data)
        return Response(FabricReportAnswerSerializer(answer).data)

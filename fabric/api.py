"""REST API for fabrics: list and summary, import from a file, export to Slurm topology.conf."""

from django.db.models import Q, QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from fabric import services
from fabric.models import Fabric
from fabric.selectors import EXPORT_FORMATS, export_topology_conf
from ibex.accounts.permissions import ReadOrProvide, organization_of

MAX_UPLOAD_BYTES = 64 * 1024 * 1024


TENANT_FIELDS = ("id", "name", "kind", "link_rate_gbps")
TENANT_SUMMARY_KEYS = ("kind", "levels", "domain_counts", "gpus", "link_rates_gbps",
                       "oversubscription", "rail_optimised")


class FabricSerializer(serializers.ModelSerializer):
    owner = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    link_rate_gbps = serializers.DecimalField(max_digits=7, decimal_places=1, read_only=True,
                                              allow_null=True)

    class Meta:
        model = Fabric
        fields = ["id", "name", "owner", "kind", "link_rate_gbps", "source", "summary",
                  "gateway", "gateway_status", "gateway_seen_at", "created_at", "updated_at"]
        read_only_fields = fields

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
    fabrics = Fabric.objects.select_related("owner")
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

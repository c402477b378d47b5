"""REST API for fabrics: list and summary, import from a file, export to Slurm topology.conf."""

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from fabric import services
from fabric.models import Fabric
from fabric.selectors import EXPORT_FORMATS, export_topology_conf
from ibex.accounts.permissions import ReadOrProvide, organization_of

MAX_UPLOAD_BYTES = 64 * 1024 * 1024


class FabricSerializer(serializers.ModelSerializer):
    owner = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    link_rate_gbps = serializers.DecimalField(max_digits=7, decimal_places=1, read_only=True,
                                              allow_null=True)

    class Meta:
        model = Fabric
        fields = ["id", "name", "owner", "kind", "link_rate_gbps", "source", "summary",
                  "created_at", "updated_at"]
        read_only_fields = fields


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
    """Operators see every fabric; providers see their own."""
    fabrics = Fabric.objects.select_related("owner")
    if organization.is_operator:
        return fabrics
    return fabrics.filter(owner=organization)


class FabricViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = FabricSerializer
    permission_classes = [ReadOrProvide]
    filterset_fields = ["kind", "source"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no caller
            return Fabric.objects.none()
        return visible_fabrics(organization_of(self.request))

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
        try:
            result = services.import_fabric_file(
                owner=organization, name=form.validated_data["name"], text=text,
                fmt=form.validated_data["format"], path=upload.name,
                gpus_per_node=form.validated_data["gpus_per_node"],
            )
        except services.FabricImportError as exc:
            raise ValidationError({"file": [str(exc)]}) from None
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
        fmt = request.query_params.get("format", "slurm-tree")
        if fmt not in EXPORT_FORMATS:
            raise ValidationError({"format": [f"use one of {', '.join(EXPORT_FORMATS)}"]})
        return Response(export_topology_conf(fabric, fmt), content_type="text/plain")

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse


@extend_schema(
    summary="API root: links to the schema, the docs and each resource",
    responses=inline_serializer(
        "ApiRoot",
        {
            "name": serializers.CharField(),
            "version": serializers.CharField(),
            "links": serializers.DictField(child=serializers.URLField()),
        },
    ),
)
@api_view(["GET"])
@permission_classes([AllowAny])
def api_root(request):
    return Response(
        {
            "name": "IBEX",
            "version": "v1",
            "links": {
                "schema": reverse("schema", request=request),
                "docs": reverse("docs", request=request),
                "health": request.build_absolute_uri("/healthz"),
                "ready": request.build_absolute_uri("/readyz"),
            },
        }
    )

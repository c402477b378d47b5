from django.urls import NoReverseMatch, get_resolver
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
    links = {
        "schema": reverse("schema", request=request),
        "docs": reverse("docs", request=request),
        "health": request.build_absolute_uri("/healthz"),
        "ready": request.build_absolute_uri("/readyz"),
    }
    links.update(resource_links(request))
    return Response({"name": "IBEX", "version": "v1", "links": links})


def resource_links(request) -> dict[str, str]:
    """Every collection the apps' routers registered (URL names `<basename>-list`), found in
    the URL configuration so that the project package imports no app."""
    links = {}
    names = sorted(name for name in get_resolver().reverse_dict
                   if isinstance(name, str) and name.endswith("-list"))
    for name in names:
        try:
            url = reverse(name, request=request)
        except NoReverseMatch:  # a nested collection needs its parent's id
            continue
        if "/api/v1/" in url:  # named by its path: "orders", "account/topups"
            links[url.split("/api/v1/", 1)[1].strip("/")] = url
    return links

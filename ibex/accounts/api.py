from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.response import Response


class WhoAmISerializer(serializers.Serializer):
    username = serializers.CharField()
    organizations = serializers.ListField(child=serializers.CharField())
    api_key = serializers.CharField(allow_null=True, help_text="prefix of the key in use")
    scopes = serializers.ListField(child=serializers.CharField())


@extend_schema(summary="Who the caller is: user, organisations and the key's scopes",
               responses=WhoAmISerializer)
@api_view(["GET"])
def whoami(request):
    api_key = request.auth if hasattr(request.auth, "prefix") else None
    organizations = sorted(
        request.user.memberships.values_list("organization__slug", flat=True)
    )
    return Response(WhoAmISerializer({
        "username": request.user.get_username(),
        "organizations": organizations,
        "api_key": api_key.prefix if api_key else None,
        "scopes": api_key.scopes if api_key else [],
    }).data)

"""Self-service API: who am I, organisations (sign-up), API keys, provider onboarding."""

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import api_view
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from ibex.accounts import services
from ibex.accounts.models import ApiKey, Organization, ProviderProfile
from ibex.accounts.permissions import ReadOrProvide, organization_of, scopes_of
from ibex.api.throttles import KeyCreationThrottle


class StrictSerializer(serializers.Serializer):
    """Rejects unknown fields, naming them, instead of silently ignoring them (nested too)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field."] for name in sorted(unknown)})
        return super().to_internal_value(data)


class WhoAmISerializer(serializers.Serializer):
    username = serializers.CharField()
    organizations = serializers.ListField(child=serializers.CharField())
    api_key = serializers.CharField(allow_null=True, help_text="prefix of the key in use")
    scopes = serializers.ListField(child=serializers.CharField())


@extend_schema(summary="Who the caller is: user, organisations and the key's scopes",
               responses=WhoAmISerializer)
@api_view(["GET"])
def whoami(request):
    api_key = request.auth if isinstance(request.auth, ApiKey) else None
    organizations = sorted(request.user.memberships.values_list("organization__slug", flat=True))
    return Response(WhoAmISerializer({
        "username": request.user.get_username(),
        "organizations": organizations,
        "api_key": api_key.prefix if api_key else None,
        "scopes": api_key.scopes if api_key else [],
    }).data)


# --- organisations ----------------------------------------------------------------------------

ROLE_SCOPES = {"tenant": ["read", "trade"], "provider": ["read", "provide"]}


class OrganizationSerializer(serializers.ModelSerializer):
    roles = serializers.SerializerMethodField()

    class Meta:
        model = Organization
        fields = ["id", "slug", "name", "roles", "created_at"]

    def get_roles(self, org) -> list[str]:
        return [r for r in services.ROLES if getattr(org, f"is_{r}")]


class SignUpSerializer(StrictSerializer):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200)
    roles = serializers.ListField(child=serializers.ChoiceField(choices=["tenant", "provider"]),
                                  min_length=1, max_length=2)
    username = serializers.CharField(max_length=150, required=False)
    email = serializers.EmailField(required=False)
    password = serializers.CharField(write_only=True, required=False, style={"input_type": "password"})

    def validate_slug(self, slug):
        if Organization.objects.filter(slug=slug).exists():
            raise serializers.ValidationError("An organisation with this slug exists.")
        return slug

    def validate(self, attrs):
        attrs = super().validate(attrs)
        request = self.context["request"]
        if not request.user.is_authenticated:
            missing = [f for f in ("username", "email", "password") if not attrs.get(f)]
            if missing:
                raise serializers.ValidationError({f: ["Required to sign up."] for f in missing})
            if get_user_model().objects.filter(username=attrs["username"]).exists():
                raise serializers.ValidationError({"username": ["This username is taken."]})
            try:
                validate_password(attrs["password"])
            except DjangoValidationError as exc:
                raise serializers.ValidationError({"password": list(exc.messages)}) from None
        return attrs


class SignUpResultSerializer(OrganizationSerializer):
    api_key = serializers.CharField(help_text="shown only once")

    class Meta(OrganizationSerializer.Meta):
        fields = [*OrganizationSerializer.Meta.fields, "api_key"]


class SignUpThrottle(AnonRateThrottle):
    rate = "20/hour"


class OrganizationViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    serializer_class = OrganizationSerializer

    def get_permissions(self):
        return [AllowAny()] if self.action == "create" else [IsAuthenticated()]

    def get_throttles(self):
        return [SignUpThrottle()] if self.action == "create" else super().get_throttles()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Organization.objects.none()
        return Organization.objects.filter(memberships__user=self.request.user).order_by("-id")

    @extend_schema(request=SignUpSerializer, responses={201: SignUpResultSerializer},
                   summary="Create an organisation (signing up when anonymous) and its first key")
    @transaction.atomic
    def create(self, request):
        form = SignUpSerializer(data=request.data, context={"request": request})
        form.is_valid(raise_exception=True)
        data = form.validated_data
        user = request.user
        if not user.is_authenticated:
            user = get_user_model().objects.create_user(
                username=data["username"], email=data["email"], password=data["password"])
        org = services.create_organization(slug=data["slug"], name=data["name"],
                                           roles=tuple(data["roles"]), owner=user)
        scopes = sorted({"admin", *(s for r in data["roles"] for s in ROLE_SCOPES[r])})
        issued = services.issue_api_key(organization=org, scopes=scopes, user=user,
                                        name="first key")
        body = {**OrganizationSerializer(org).data, "api_key": issued.raw_key}
        return Response(body, status=status.HTTP_201_CREATED)


# --- API keys ---------------------------------------------------------------------------------


class ApiKeySerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "scopes", "created_at", "expires_at", "revoked_at",
                  "last_used_at"]
        read_only_fields = fields


class ApiKeyCreateSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, required=False, default="")
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=ApiKey.Scope.values),
                                   min_length=1)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class IssuedKeySerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="shown only once")

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                    mixins.DestroyModelMixin, viewsets.GenericViewSet):
    serializer_class = ApiKeySerializer

    def get_throttles(self):
        extra = [KeyCreationThrottle()] if self.action == "create" else []
        return [*super().get_throttles(), *extra]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiKey.objects.none()
        return ApiKey.objects.filter(organization=organization_of(self.request))

    def _require_admin(self):
        if "admin" not in scopes_of(self.request):
            raise PermissionDenied("Managing keys needs a key with the 'admin' scope.")

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: IssuedKeySerializer})
    def create(self, request):
        self._require_admin()
        form = ApiKeyCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        own = scopes_of(request)
        wider = set(form.validated_data["scopes"]) - own
        if wider:
            raise serializers.ValidationError(
                {"scopes": [f"Cannot grant scopes you lack: {', '.join(sorted(wider))}."]})
        issued = services.issue_api_key(organization=organization_of(request), user=request.user,
                                        **form.validated_data)
        body = {**ApiKeySerializer(issued.api_key).data, "key": issued.raw_key}
        return Response(body, status=status.HTTP_201_CREATED)

    def destroy(self, request, pk=None):
        self._require_admin()
        services.revoke_api_key(api_key=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- provider onboarding ------------------------------------------------------------------------


class ProviderProfileSerializer(serializers.ModelSerializer):
    organization = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    history = serializers.SerializerMethodField()

    class Meta:
        model = ProviderProfile
        fields = ["organization", "state", "legal_name", "country", "payout_email",
                  "state_changed_at", "history"]
        read_only_fields = ["organization", "state", "state_changed_at", "history"]

    def get_history(self, profile) -> list[dict]:
        return [{"from": c.from_state, "to": c.to_state, "actor": c.actor, "reason": c.reason,
                 "at": c.at} for c in profile.changes.all()]


class ProviderDetailsSerializer(StrictSerializer):
    legal_name = serializers.CharField(max_length=200, required=False)
    country = serializers.RegexField(r"^[A-Z]{2}$", required=False,
                                     error_messages={"invalid": "Use an ISO 3166 alpha-2 code."})
    payout_email = serializers.EmailField(required=False)


class ProviderProfileView(APIView):
    permission_classes = [ReadOrProvide]  # changing details needs `provide`

    def _profile(self, request) -> ProviderProfile:
        org = organization_of(request)
        profile = ProviderProfile.objects.filter(organization=org).first()
        if profile is None:
            raise PermissionDenied("Your organisation is not a provider.")
        return profile

    @extend_schema(responses=ProviderProfileSerializer, summary="Your provider onboarding")
    def get(self, request):
        return Response(ProviderProfileSerializer(self._profile(request)).data)

    @extend_schema(request=ProviderDetailsSerializer, responses=ProviderProfileSerializer,
                   summary="Update organisation and payout details")
    def patch(self, request):
        profile = self._profile(request)
        form = ProviderDetailsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        profile = services.update_provider_details(organization=profile.organization,
                                                   **form.validated_data)
        return Response(ProviderProfileSerializer(profile).data)

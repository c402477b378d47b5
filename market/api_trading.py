"""REST API for prices (providers) and leases (tenants). Thin: validate, call a service,
serialize."""

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrProvide, ReadOrTrade, organization_of
from ibex.api.errors import ApiError
from market import leasing, prices
from market.api import DollarsField
from market.models import Allocation, GpuPrice, Lease, LeaseEvent
from market.money import to_dollars

# --- prices -------------------------------------------------------------------------------------


class PriceScopeSerializer(StrictSerializer):
    fabric = serializers.CharField(max_length=100, required=False)
    gpu_model = serializers.CharField(max_length=40, required=False)
    node = serializers.CharField(max_length=200, required=False,
                                 help_text="a node's id or hostname")
    leaf = serializers.CharField(max_length=200, required=False)
    gpu = serializers.IntegerField(min_value=1, required=False)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if not attrs:
            raise serializers.ValidationError(
                {"non_field_errors": [f"Name at least one of {', '.join(prices.SCOPE_KEYS)}."]})
        return attrs


class PriceChangeSerializer(StrictSerializer):
    scope = PriceScopeSerializer()
    price_per_gpu_hour = DollarsField()
    offered_from = serializers.DateTimeField(required=False, allow_null=True, default=None)
    offered_until = serializers.DateTimeField(required=False, allow_null=True, default=None)
    min_lease_hours = serializers.IntegerField(min_value=1, max_value=8760, default=1)

    def validate_price_per_gpu_hour(self, micros):
        if micros < 0:
            raise serializers.ValidationError("A price cannot be negative.")
        if micros > 1_000 * 1_000_000:
            raise serializers.ValidationError("At most 1000.00 per GPU-hour.")
        return micros


class PriceChangeResultSerializer(serializers.Serializer):
    gpus_priced = serializers.IntegerField()
    price_per_gpu_hour = DollarsField()


class GpuPriceSerializer(serializers.ModelSerializer):
    price_per_gpu_hour = DollarsField(source="price_micros")
    current = serializers.SerializerMethodField()

    class Meta:
        model = GpuPrice
        fields = ["id", "gpu", "price_per_gpu_hour", "offered_from", "offered_until",
                  "min_lease_hours", "set_by", "set_at", "superseded_at", "current"]

    def get_current(self, price) -> bool:
        return price.superseded_at is None


class PriceViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Providers' prices: every change is kept; `?gpu=ID` gives one GPU's history,
    `?current=true` only the prices in force."""

    serializer_class = GpuPriceSerializer
    permission_classes = [ReadOrProvide]
    filterset_fields = ["gpu"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return GpuPrice.objects.none()
        rows = GpuPrice.objects.filter(gpu__node__provider=organization_of(self.request))
        if self.request.query_params.get("current") == "true":
            rows = rows.filter(superseded_at__isnull=True)
        return rows

    @extend_schema(request=PriceChangeSerializer, responses={201: PriceChangeResultSerializer},
                   summary="Price one GPU, or all of a node, model, leaf or fabric at once")
    def create(self, request):
        provider = organization_of(request)
        if not provider.is_provider:
            raise PermissionDenied("Only providers set prices.")
        form = PriceChangeSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        try:
            change = prices.set_prices(
                provider=provider, scope=data["scope"], price_micros=data["price_per_gpu_hour"],
                offered_from=data["offered_from"], offered_until=data["offered_until"],
                min_lease_hours=data["min_lease_hours"], actor=request.user.get_username())
        except prices.PriceError as exc:
            raise serializers.ValidationError({exc.field: [exc.message]}) from None
        return Response({"gpus_priced": change.gpus_priced,
                         "price_per_gpu_hour": to_dollars(change.price_micros)},
                        status=status.HTTP_201_CREATED)


# --- leases -------------------------------------------------------------------------------------


class LeaseEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = LeaseEvent
        fields = ["at", "kind", "from_state", "to_state", "actor", "reason"]


class LeaseGpuSerializer(serializers.Serializer):
    node = serializers.CharField()
    index = serializers.IntegerField()


class LeaseSerializer(serializers.ModelSerializer):
    price_per_gpu_hour = DollarsField(source="price_micros")
    max_price_per_gpu_hour = DollarsField(source="max_price_micros")
    gpus = serializers.SerializerMethodField()
    events = LeaseEventSerializer(many=True)

    class Meta:
        model = Lease
        fields = ["id", "state", "tier", "gpu_model", "gpu_count", "gpus", "locality",
                  "price_per_gpu_hour", "max_price_per_gpu_hour", "starts_at", "ends_at",
                  "preempt_at", "created_at", "events"]

    @extend_schema_field(LeaseGpuSerializer(many=True))
    def get_gpus(self, lease) -> list[dict]:
        return [{"node": a.gpu.node.hostname, "index": a.gpu.index}
                for a in lease.allocations.all()]


class ExtendSerializer(StrictSerializer):
    hours = serializers.IntegerField(min_value=1, max_value=8760)


class LeaseViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A tenant's leases (operators see all); another organisation's lease is a 404."""

    serializer_class = LeaseSerializer
    permission_classes = [ReadOrTrade]
    filterset_fields = ["state", "tier", "gpu_model"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Lease.objects.none()
        org = organization_of(self.request)
        leases = Lease.objects.prefetch_related(
            "events", Prefetch("allocations", queryset=Allocation.objects.select_related(
                "gpu__node").order_by("gpu__node__hostname", "gpu__index")))
        return leases if org.is_operator else leases.filter(tenant=org)

    @extend_schema(request=None, responses=LeaseSerializer, summary="End the lease now")
    @action(detail=True, methods=["post"])
    def terminate(self, request, pk=None):
        lease = self.get_object()
        try:
            leasing.terminate_lease(lease=lease, actor=request.user.get_username())
        except leasing.LeaseTransitionError as exc:
            raise ApiError(str(exc), code="invalid_state", status_code=409) from None
        return Response(LeaseSerializer(self.get_queryset().get(pk=lease.pk)).data)

    @extend_schema(request=ExtendSerializer, responses=LeaseSerializer,
                   summary="Extend the lease when its GPUs stay free")
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        lease = self.get_object()
        form = ExtendSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            leasing.extend_lease(lease=lease, hours=form.validated_data["hours"],
                                 actor=request.user.get_username())
        except leasing.LeaseTransitionError as exc:
            raise ApiError(str(exc), code="invalid_state", status_code=409) from None
        except leasing.GpusUnavailable as exc:
            raise ApiError(str(exc), code="gpus_unavailable", status_code=409) from None
        return Response(LeaseSerializer(self.get_queryset().get(pk=lease.pk)).data)


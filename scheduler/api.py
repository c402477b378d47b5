"""REST API for service levels, tenant events and webhook endpoints. Thin: validate, call
`scheduler.sla` / `scheduler.webhooks`, serialize. Another organisation's rows are a 404."""

from __future__ import annotations

import django_filters
from django.http import Http404
from drf_spectacular.utils import extend_schema
from market.api import DollarsField
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrTrade, organization_of
from market.models import Lease
from scheduler import sla, webhooks
from scheduler.models import Event, SlaCredit, WebhookDelivery, WebhookEndpoint

# --- SLA of a lease -------------------------------------------------------------------------------


class SlaTermsSerializer(serializers.Serializer):
    tier = serializers.CharField()
    availability_target_percent = serializers.CharField(allow_null=True)
    activation_limit_s = serializers.IntegerField(allow_null=True)
    promised_locality = serializers.JSONField()


class GpuDowntimeSerializer(serializers.Serializer):
    gpu = serializers.CharField()
    seconds = serializers.IntegerField()


class SlaMeasurementSerializer(serializers.Serializer):
    measured_until = serializers.DateTimeField()
    won_at = serializers.DateTimeField()
    active_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    lease_gpu_seconds = serializers.IntegerField()
    down_gpu_seconds = serializers.IntegerField()
    availability_percent = serializers.CharField()
    availability_breached = serializers.BooleanField()
    activation_s = serializers.IntegerField(allow_null=True)
    activation_late = serializers.BooleanField()
    down_gpus = GpuDowntimeSerializer(many=True)
    locality_now = serializers.JSONField(help_text="where its GPUs sit now")
    locality_kept = serializers.BooleanField(help_text="no farther apart than promised")


class SlaCreditSerializer(serializers.ModelSerializer):
    amount = DollarsField(source="amount_micros")
    ledger_transaction = serializers.IntegerField(source="transaction_id", allow_null=True)

    class Meta:
        model = SlaCredit
        fields = ["id", "window_start", "window_end", "amount", "down_gpu_seconds",
                  "lease_gpu_seconds", "activation_s", "reason", "ledger_transaction",
                  "created_at"]


class LeaseSlaSerializer(serializers.Serializer):
    lease = serializers.IntegerField()
    terms = SlaTermsSerializer()
    measurement = SlaMeasurementSerializer()
    cost_so_far = DollarsField()
    owed = DollarsField()
    credited = DollarsField()
    credits = SlaCreditSerializer(many=True)


def _percent(value) -> str:
    return f"{value * 100:.4f}"


class LeaseSlaView(APIView):
    """The lease's promised service level, what was measured so far and the credits paid."""

    permission_classes = [ReadOrTrade]

    @extend_schema(responses=LeaseSlaSerializer, summary="A lease's SLA: terms, measurement, "
                                                         "credits")
    def get(self, request, pk: int):
        org = organization_of(request)
        leases = Lease.objects.all() if org.is_operator else Lease.objects.filter(tenant=org)
        lease = leases.filter(pk=pk).first()
        if lease is None:
            raise Http404
        report = sla.sla_report(lease)
        terms, m, owed = report["sla"], report["measurement"], report["owed"]
        target = terms.availability_target_bp
        body = {
            "lease": lease.pk,
            "terms": {"tier": terms.tier,
                      "availability_target_percent": None if target is None
                      else f"{target / 100:.2f}",
                      "activation_limit_s": terms.activation_limit_s,
                      "promised_locality": terms.promised_locality},
            "measurement": {
                "measured_until": m.measured_until, "won_at": m.won_at,
                "active_at": m.active_at, "ended_at": m.ended_at,
                "lease_gpu_seconds": m.lease_gpu_seconds,
                "down_gpu_seconds": m.down_gpu_seconds,
                "availability_percent": _percent(m.availability),
                "availability_breached": sla.measure_core.breaches_availability(
                    m.down_gpu_seconds, m.lease_gpu_seconds, target),
                "activation_s": m.activation_s, "activation_late": m.activation_late,
                "down_gpus": [{"gpu": g.gpu, "seconds": g.seconds} for g in m.gpus],
                "locality_now": report["locality_now"],
                "locality_kept": report["locality_kept"]},
            "cost_so_far": report["cost_so_far_micros"],
            "owed": owed.total_micros,
            "credited": sum(c.amount_micros for c in report["credits"]),
            "credits": report["credits"],
        }
        return Response(LeaseSlaSerializer(body).data)


# --- events ---------------------------------------------------------------------------------------


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = ["id", "kind", "lease", "payload", "occurred_at", "created_at"]


class EventFilter(django_filters.FilterSet):
    kind = django_filters.ChoiceFilter(choices=Event.Kind.choices)
    lease = django_filters.NumberFilter(field_name="lease_id")

    class Meta:
        model = Event
        fields = ["kind", "lease"]


class EventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Events about your leases, newest first: started, preemption notice, preempted,
    degraded, moved, credited, ended."""

    serializer_class = EventSerializer
    permission_classes = [ReadOrTrade]
    filterset_class = EventFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Event.objects.none()
        return Event.objects.filter(tenant=organization_of(self.request))


# --- webhook endpoints ----------------------------------------------------------------------------


class WebhookEndpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "active", "created_at"]


class WebhookEndpointCreatedSerializer(serializers.ModelSerializer):
    secret = serializers.CharField(help_text="shown only now: sign-check deliveries with it")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "description", "active", "created_at", "secret"]


class WebhookEndpointCreateSerializer(StrictSerializer):
    url = serializers.CharField(max_length=500)
    description = serializers.CharField(max_length=200, required=False, default="",
                                        allow_blank=True)


class WebhookEndpointUpdateSerializer(StrictSerializer):
    url = serializers.CharField(max_length=500, required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    active = serializers.BooleanField(required=False)


class WebhookDeliverySerializer(serializers.ModelSerializer):
    event_kind = serializers.CharField(source="event.kind")

    class Meta:
        model = WebhookDelivery
        fields = ["id", "event", "event_kind", "state", "attempts", "status_code", "error",
                  "next_attempt_at", "delivered_at", "created_at"]


def _invalid(exc: webhooks.WebhookError) -> serializers.ValidationError:
    return serializers.ValidationError({exc.field or "non_field_errors": [exc.message]})


class WebhookEndpointViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                             mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your webhook endpoints. The secret is shown once, in the answer to the POST."""

    serializer_class = WebhookEndpointSerializer
    permission_classes = [ReadOrTrade]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return WebhookEndpoint.objects.none()
        return WebhookEndpoint.objects.filter(tenant=organization_of(self.request))

    @extend_schema(request=WebhookEndpointCreateSerializer,
                   responses={201: WebhookEndpointCreatedSerializer},
                   summary="Register a webhook endpoint (http or https)")
    def create(self, request):
        form = WebhookEndpointCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            endpoint = webhooks.create_endpoint(tenant=organization_of(request),
                                                url=form.validated_data["url"],
                                                description=form.validated_data["description"])
        except webhooks.WebhookError as exc:
            raise _invalid(exc) from None
        return Response(WebhookEndpointCreatedSerializer(endpoint).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookEndpointUpdateSerializer, responses=WebhookEndpointSerializer,
                   summary="Change an endpoint's URL or description, or pause it")
    def partial_update(self, request, pk=None):
        endpoint = self.get_object()
        form = WebhookEndpointUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        try:
            endpoint = webhooks.update_endpoint(endpoint=endpoint, **form.validated_data)
        except webhooks.WebhookError as exc:
            raise _invalid(exc) from None
        return Response(WebhookEndpointSerializer(endpoint).data)

    def perform_destroy(self, instance):
        webhooks.delete_endpoint(endpoint=instance)

    @extend_schema(responses=WebhookDeliverySerializer(many=True),
                   summary="The endpoint's delivery log, newest first")
    @action(detail=True, methods=["get"])
    def deliveries(self, request, pk=None):
        endpoint = self.get_object()
        rows = (WebhookDelivery.objects.filter(endpoint=endpoint).select_related("event")
                .order_by("-id"))
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(WebhookDeliverySerializer(page, many=True).data)

"""REST API for tenant events and webhook endpoints. Thin: validate, call `notify.webhooks`,
serialize. Another organisation's rows are a 404."""

from __future__ import annotations

import django_filters
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrTrade, organization_of
from notify import webhooks
from notify.models import Event, WebhookDelivery, WebhookEndpoint

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
        endpoint = webhooks.create_endpoint(tenant=organization_of(request),
                                            url=form.validated_data["url"],
                                            description=form.validated_data["description"])
        return Response(WebhookEndpointCreatedSerializer(endpoint).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=WebhookEndpointUpdateSerializer, responses=WebhookEndpointSerializer,
                   summary="Change an endpoint's URL or description, or pause it")
    def partial_update(self, request, pk=None):
        endpoint = self.get_object()
        form = WebhookEndpointUpdateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        endpoint = webhooks.update_endpoint(endpoint=endpoint, **form.validated_data)
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

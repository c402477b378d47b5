"""REST API for money: balances, ledger entries, top-ups, refunds, Connect and payouts,
invoices and statements, and the Stripe webhook. Thin: validate, call services, serialize."""

from __future__ import annotations

import django_filters
import stripe
from django.http import HttpResponse
from django.template.loader import render_to_string
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from billing import invoices, services, stripe_gateway
from billing.core import money
from billing.models import (
    Account,
    ConnectAccount,
    Entry,
    LedgerTransaction,
    Payout,
    Refund,
    SpendLimit,
    TopUp,
)
from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrTrade, organization_of, scopes_of
from ibex.api.errors import ApiError
from ibex.api.filters import UtcIsoDateTimeFilter


@extend_schema_field({"type": "string", "pattern": money.DOLLARS_PATTERN, "example": "123.45"})
class DollarsField(serializers.Field):
    """Money as a decimal string of dollars (money.parse_dollars); micro-dollars inside."""

    def to_representation(self, micros):
        return money.to_dollars(micros)

    def to_internal_value(self, data):
        try:
            return money.parse_dollars(data)
        except money.BadAmount as exc:
            raise serializers.ValidationError(str(exc)) from None


def _require(request, scope: str) -> None:
    if not ({scope, "admin"} & scopes_of(request)):
        raise PermissionDenied(f"This needs an API key with the '{scope}' scope.")


# --- balances ------------------------------------------------------------------------------------


class AccountSerializer(serializers.Serializer):
    organization = serializers.CharField()
    currency = serializers.CharField()
    available = DollarsField(source="balances.available_micros")
    held = DollarsField(source="balances.held_micros")
    payable = DollarsField(source="balances.payable_micros")
    held_back = DollarsField(source="balances.held_back_micros")
    spend_limit_per_hour = DollarsField(allow_null=True)
    spend_limit_per_month = DollarsField(allow_null=True)


class SpendLimitsSerializer(StrictSerializer):
    spend_limit_per_hour = DollarsField(allow_null=True)
    spend_limit_per_month = DollarsField(allow_null=True)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        for name, value in attrs.items():
            if value is not None and value < 0:
                raise serializers.ValidationError({name: ["A limit cannot be negative."]})
        return attrs


class AccountView(APIView):
    permission_classes = [ReadOrTrade]

    def _body(self, org):
        limit = SpendLimit.objects.filter(organization=org).first()
        return AccountSerializer({
            "organization": org.slug, "currency": "usd", "balances": services.balances_of(org),
            "spend_limit_per_hour": limit.per_hour_micros if limit else None,
            "spend_limit_per_month": limit.per_month_micros if limit else None,
        }).data

    @extend_schema(responses=AccountSerializer, summary="Your balances and spend limits")
    def get(self, request):
        return Response(self._body(organization_of(request)))

    @extend_schema(request=SpendLimitsSerializer, responses=AccountSerializer,
                   summary="Set your spend limits (null: no limit)")
    def patch(self, request):
        _require(request, "admin")
        form = SpendLimitsSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        org = organization_of(request)
        services.set_spend_limits(organization=org,
                                  per_hour_micros=form.validated_data["spend_limit_per_hour"],
                                  per_month_micros=form.validated_data["spend_limit_per_month"])
        return Response(self._body(org))


class EntrySerializer(serializers.ModelSerializer):
    account = serializers.CharField(source="account.kind")
    amount = DollarsField(source="amount_micros")
    cause = serializers.CharField(source="transaction.cause")
    source_type = serializers.CharField(source="transaction.source_type")
    source_id = serializers.CharField(source="transaction.source_id")
    memo = serializers.CharField(source="transaction.memo")
    transaction = serializers.IntegerField(source="transaction_id")

    class Meta:
        model = Entry
        fields = ["id", "transaction", "account", "amount", "cause", "source_type", "source_id",
                  "memo", "created_at"]


class EntryFilter(django_filters.FilterSet):
    account = django_filters.ChoiceFilter(field_name="account__kind", choices=Account.Kind.choices)
    cause = django_filters.ChoiceFilter(field_name="transaction__cause",
                                        choices=LedgerTransaction.Cause.choices)
    source_type = django_filters.CharFilter(field_name="transaction__source_type")
    source_id = django_filters.CharFilter(field_name="transaction__source_id")
    since = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Entry
        fields = ["account", "cause", "source_type", "source_id", "since", "before"]


class EntryViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    """Your ledger entries, newest first."""

    serializer_class = EntrySerializer
    permission_classes = [ReadOrTrade]
    filterset_class = EntryFilter

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Entry.objects.none()
        return (Entry.objects.filter(account__organization=organization_of(self.request))
                .select_related("account", "transaction"))


# --- top-ups and refunds ---------------------------------------------------------------------------


class TopUpSerializer(serializers.ModelSerializer):
    amount = DollarsField(source="amount_micros")
    refunded = DollarsField(source="refunded_micros")
    publishable_key = serializers.SerializerMethodField()

    class Meta:
        model = TopUp
        fields = ["id", "amount", "currency", "state", "automatic", "payment_intent_id",
                  "client_secret", "publishable_key", "refunded", "last_error", "created_at",
                  "state_changed_at"]

    def get_publishable_key(self, top_up) -> str:
        from django.conf import settings

        return settings.STRIPE_PUBLISHABLE_KEY


class TopUpCreateSerializer(StrictSerializer):
    amount = DollarsField(help_text="dollars, whole cents")


def _idempotency_key(request) -> str | None:
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 100:
        raise serializers.ValidationError({"Idempotency-Key": ["At most 100 characters."]})
    return key or None


class TopUpViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                   viewsets.GenericViewSet):
    """Card top-ups. POST starts one; its `client_secret` (for Stripe.js `confirmPayment`)
    appears within seconds, when the PaymentIntent exists: poll the top-up until it does."""

    serializer_class = TopUpSerializer
    permission_classes = [ReadOrTrade]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return TopUp.objects.none()
        return TopUp.objects.filter(tenant=organization_of(self.request))

    @extend_schema(request=TopUpCreateSerializer, responses={201: TopUpSerializer},
                   summary="Top up by card (send an Idempotency-Key header)")
    def create(self, request):
        form = TopUpCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        top_up = services.create_top_up(tenant=organization_of(request),
                                        amount_micros=form.validated_data["amount"],
                                        idempotency_key=_idempotency_key(request),
                                        actor=request.user.get_username())
        return Response(TopUpSerializer(top_up).data, status=status.HTTP_201_CREATED)


class RefundSerializer(serializers.ModelSerializer):
    amount = DollarsField(source="amount_micros")

    class Meta:
        model = Refund
        fields = ["id", "top_up", "amount", "state", "stripe_refund_id", "created_at"]


class RefundCreateSerializer(StrictSerializer):
    amount = DollarsField(help_text="dollars of unused available balance, whole cents")


class RefundViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    serializer_class = RefundSerializer
    permission_classes = [ReadOrTrade]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Refund.objects.none()
        return Refund.objects.filter(tenant=organization_of(self.request))

    @extend_schema(request=RefundCreateSerializer, responses={201: RefundSerializer},
                   summary="Refund unused balance to the card (send an Idempotency-Key header)")
    def create(self, request):
        _require(request, "admin")
        form = RefundCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        refund = services.request_refund(tenant=organization_of(request),
                                         amount_micros=form.validated_data["amount"],
                                         idempotency_key=_idempotency_key(request),
                                         actor=request.user.get_username())
        return Response(RefundSerializer(refund).data, status=status.HTTP_201_CREATED)


# --- providers: Connect and payouts ------------------------------------------------------------


class ConnectSerializer(serializers.ModelSerializer):
    class Meta:
        model = ConnectAccount
        fields = ["stripe_account_id", "onboarding_url", "details_submitted", "charges_enabled",
                  "payouts_enabled", "updated_at"]


class ConnectView(APIView):
    permission_classes = [ReadOrTrade]

    @extend_schema(responses=ConnectSerializer, summary="Your Stripe Connect account status")
    def get(self, request):
        connect = ConnectAccount.objects.filter(organization=organization_of(request)).first()
        if connect is None:
            raise ApiError("No payout account yet: POST here to start onboarding.",
                           code="not_found", status_code=404)
        return Response(ConnectSerializer(connect).data)

    @extend_schema(request=None, responses={202: ConnectSerializer},
                   summary="Start (or resume) payout onboarding; the link appears shortly")
    def post(self, request):
        _require(request, "provide")
        connect = services.start_connect_onboarding(provider=organization_of(request))
        return Response(ConnectSerializer(connect).data, status=status.HTTP_202_ACCEPTED)


class PayoutSerializer(serializers.ModelSerializer):
    amount = DollarsField(source="amount_micros")

    class Meta:
        model = Payout
        fields = ["id", "amount", "state", "stripe_payout_id", "last_error", "created_at",
                  "state_changed_at"]


class PayoutViewSet(mixins.ListModelMixin, viewsets.GenericViewSet):
    serializer_class = PayoutSerializer
    permission_classes = [ReadOrTrade]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Payout.objects.none()
        return Payout.objects.filter(provider=organization_of(self.request))


# --- invoices and statements -------------------------------------------------------------------


class InvoiceLineSerializer(serializers.Serializer):
    lease_ref = serializers.CharField()
    gpu_hours = serializers.DecimalField(max_digits=20, decimal_places=6)
    price_per_gpu_hour = DollarsField(source="price_per_gpu_hour_micros")
    amount = DollarsField(source="amount_micros")
    minutes = serializers.IntegerField()


class CreditLineSerializer(serializers.Serializer):
    cause = serializers.CharField()
    memo = serializers.CharField()
    amount = DollarsField(source="amount_micros")


class InvoiceSerializer(serializers.Serializer):
    organization = serializers.CharField(source="organization.slug")
    month = serializers.DateField(format="%Y-%m")
    lines = InvoiceLineSerializer(many=True)
    credits = CreditLineSerializer(many=True, help_text="SLA credits: taken off the total")
    payments = CreditLineSerializer(many=True, help_text="top-ups and credit grants paid in "
                                                         "this month: not part of the total")
    usage = DollarsField(source="usage_micros")
    credits_total = DollarsField(source="credits_micros")
    total = DollarsField(source="total_micros")


class StatementSerializer(serializers.Serializer):
    organization = serializers.CharField(source="organization.slug")
    month = serializers.DateField(format="%Y-%m")
    earnings = DollarsField(source="earnings_micros")
    fees = DollarsField(source="fees_micros")
    held_back = DollarsField(source="held_back_micros")
    net = DollarsField(source="net_micros")
    paid_out = DollarsField(source="paid_out_micros")
    payouts = PayoutSerializer(many=True)


def _month(text: str):
    try:
        return invoices.parse_month(text)
    except ValueError:
        raise serializers.ValidationError({"month": ["Write the month as YYYY-MM."]}) from None


def _html(template: str, name: str, context: dict) -> HttpResponse:
    response = HttpResponse(render_to_string(template, context), content_type="text/html")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


class InvoiceMonthSerializer(serializers.Serializer):
    month = serializers.CharField(help_text="YYYY-MM")
    url = serializers.CharField()
    html_url = serializers.CharField()


class InvoiceListView(APIView):
    """The months you have an invoice (as a tenant) or a statement (as a provider) for."""

    permission_classes = [ReadOrTrade]

    @extend_schema(responses=InvoiceMonthSerializer(many=True),
                   summary="Months with invoices or statements, newest first")
    def get(self, request):
        org = organization_of(request)
        kind = "statements" if org.is_provider and not org.is_tenant else "invoices"
        months = invoices.months_with_activity(organization=org)
        return Response(InvoiceMonthSerializer([
            {"month": m, "url": f"/api/v1/account/{kind}/{m}/",
             "html_url": f"/api/v1/account/{kind}/{m}/?format=html"} for m in months],
            many=True).data)


class InvoiceView(APIView):
    """A tenant's invoice for one month: lines per lease, credits, total. `?format=html`
    downloads it as a printable HTML page."""

    permission_classes = [ReadOrTrade]

    @extend_schema(responses={(200, "application/json"): InvoiceSerializer,
                              (200, "text/html"): OpenApiTypes.STR},
                   summary="Your invoice for a month (YYYY-MM)")
    def get(self, request, month: str):
        org = organization_of(request)
        invoice = invoices.invoice_for(tenant=org, month=_month(month))
        if request.query_params.get("format") == "html":
            d = money.to_dollars
            return _html("market/invoice.html", f"ibex-invoice-{org.slug}-{month}.html", {
                "org": org, "month": month,
                "lines": [{"lease_ref": line.lease_ref, "gpu_hours": line.gpu_hours,
                           "price": d(line.price_per_gpu_hour_micros),
                           "amount": d(line.amount_micros)} for line in invoice.lines],
                "credits": [{**c, "amount": d(c["amount_micros"])} for c in invoice.credits],
                "payments": [{**c, "amount": d(c["amount_micros"])} for c in invoice.payments],
                "usage": d(invoice.usage_micros), "credits_total": d(invoice.credits_micros),
                "total": d(invoice.total_micros)})
        return Response(InvoiceSerializer(invoice).data)


class StatementView(APIView):
    """A provider's statement for one month; `?format=html` downloads it."""

    permission_classes = [ReadOrTrade]

    @extend_schema(responses={(200, "application/json"): StatementSerializer,
                              (200, "text/html"): OpenApiTypes.STR},
                   summary="Your provider statement for a month (YYYY-MM)")
    def get(self, request, month: str):
        org = organization_of(request)
        statement = invoices.statement_for(provider=org, month=_month(month))
        if request.query_params.get("format") == "html":
            d = money.to_dollars
            return _html("market/statement.html", f"ibex-statement-{org.slug}-{month}.html", {
                "org": org, "month": month, "earnings": d(statement.earnings_micros),
                "fees": d(statement.fees_micros), "held_back": d(statement.held_back_micros),
                "net": d(statement.net_micros),
                "payouts": [{"id": p.id, "created_at": p.created_at, "state": p.state,
                             "amount": d(p.amount_micros)} for p in statement.payouts]})
        return Response(StatementSerializer(statement).data)


# --- the Stripe webhook --------------------------------------------------------------------------


class WebhookAnswerSerializer(serializers.Serializer):
    received = serializers.BooleanField()
    duplicate = serializers.BooleanField()
    outcome = serializers.CharField()


class StripeWebhookView(APIView):
    """Stripe's deliveries: verified by signature, stored once per event id."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    @extend_schema(request=OpenApiTypes.OBJECT, responses=WebhookAnswerSerializer,
                   summary="Stripe webhook endpoint (signed by Stripe)")
    def post(self, request):
        try:
            event = stripe_gateway.verify_webhook(request.body,
                                                  request.headers.get("Stripe-Signature", ""))
        except (ValueError, stripe.SignatureVerificationError) as exc:
            raise ApiError(f"not a valid Stripe delivery: {exc}", code="bad_signature",
                           status_code=400) from None
        result = services.receive_stripe_event(event=event)
        return Response({"received": True, "duplicate": result.duplicate,
                         "outcome": result.outcome})


__all__ = ["AccountView", "InvoiceListView", "EntryViewSet", "InvoiceView", "StatementView", "StripeWebhookView",
           "TopUpViewSet", "RefundViewSet", "ConnectView", "PayoutViewSet"]

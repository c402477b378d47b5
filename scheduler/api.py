"""REST API for service levels and fabric gateways. Thin: validate, call `scheduler.sla` or
`scheduler.gateway`, serialize. Another organisation's rows are a 404. Tenant events and
webhook endpoints: `notify/api.py`."""

from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api import DollarsField
from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import ReadOrProvide, ReadOrTrade, organization_of
from market.models import Lease
from scheduler import gateway, sla
from scheduler.models import SlaCredit

# --- SLA of a lease -------------------------------------------------------------------------------


class SlaTermsSerializer(serializers.Serializer):
    tier = serializers.CharField()
    availability_target_percent = serializers.CharField(allow_null=True)
    activation_limit_s = serializers.IntegerField(allow_null=True)
    promised_locality = serializers.JSONField()


class GpuDowntimeSerializer(serializers.Serializer):
    gpu = serializers.CharField()
    seconds = serializers.IntegerField()


class FaultyLinkSerializer(serializers.Serializer):
    link = serializers.CharField(help_text="`leaf01 port 5 - spine01 port 1`")
    kind = serializers.CharField(help_text="down, or errors above the provider's threshold")
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, help_text="null: faulty still")


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
    faulty_links = FaultyLinkSerializer(many=True, help_text=(
        "links on its path that were down or erring: its GPUs on the hosts they serve count "
        "down meanwhile"))
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
                "faulty_links": report["faulty_links"],
                "locality_now": report["locality_now"],
                "locality_kept": report["locality_kept"]},
            "cost_so_far": report["cost_so_far_micros"],
            "owed": owed.total_micros,
            "credited": sum(c.amount_micros for c in report["credits"]),
            "credits": report["credits"],
        }
        return Response(LeaseSlaSerializer(body).data)


# --- a fabric gateway's heartbeat (Slurm) ---------------------------------------------------------


class BusyGpuSerializer(StrictSerializer):
    index = serializers.IntegerField(min_value=0, max_value=63)
    reason = serializers.CharField(max_length=300)


class GatewayNodeSerializer(StrictSerializer):
    hostname = serializers.CharField(max_length=200)
    gpus = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=63),
                                 max_length=64, help_text="the GPU indexes Slurm knows")
    down = serializers.CharField(max_length=300, required=False, default="", allow_blank=True,
                                 help_text="why Slurm runs nothing there (DOWN, DRAIN, FAIL, "
                                           "NOT_RESPONDING and its reason); \"\" when it does")
    busy = BusyGpuSerializer(many=True, required=False, default=list, max_length=64,
                             help_text="GPUs running jobs outside IBEX reservations")
    serving = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                    default=list, max_length=256,
                                    help_text="leases whose reservation holds this node")


class RefusedReservationSerializer(StrictSerializer):
    lease = serializers.CharField(max_length=64)
    message = serializers.CharField(max_length=500)


class GatewayHeartbeatSerializer(StrictSerializer):
    fabric = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(choices=gateway.KINDS)
    status = serializers.CharField(max_length=300, default="ok",
                                   help_text='"ok", or what is wrong ("slurm unreachable: ...")')
    nodes = GatewayNodeSerializer(many=True, max_length=10_000)
    refused = RefusedReservationSerializer(many=True, required=False, default=list,
                                           max_length=10_000)


class ReservationSerializer(serializers.Serializer):
    name = serializers.CharField()
    lease = serializers.CharField()
    account = serializers.CharField()
    ends_at = serializers.DateTimeField()
    nodes = serializers.DictField(child=serializers.ListField(child=serializers.IntegerField()),
                                  help_text="hostname -> the lease's GPU indexes there")


class GatewayAnswerSerializer(serializers.Serializer):
    interval_s = serializers.IntegerField()
    reservations = ReservationSerializer(many=True)
    unregistered = serializers.ListField(child=serializers.CharField(),
                                         help_text="reported hosts with no node: register them")


class GatewayHeartbeatView(APIView):
    """One request per interval from a fabric's gateway (`ibex-agent slurm`): every node as the
    scheduler sees it; the answer is the reservations the fabric should hold."""

    permission_classes = [ReadOrProvide]

    @extend_schema(request=GatewayHeartbeatSerializer, responses=GatewayAnswerSerializer,
                   summary="A fabric gateway reports all its nodes; answered with reservations")
    def post(self, request):
        provider = organization_of(request)
        if not provider.is_provider:
            raise PermissionDenied("Only providers run fabric gateways.")
        form = GatewayHeartbeatSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        nodes = [gateway.NodeReport(
            hostname=n["hostname"], gpus=sorted(set(n["gpus"])), down=n["down"],
            busy={b["index"]: b["reason"] for b in n["busy"]}, serving=list(n["serving"]))
            for n in data["nodes"]]
        refused = [gateway.RefusedReservation(r["lease"], r["message"]) for r in data["refused"]]
        answer = gateway.record_gateway_heartbeat(
            provider=provider, fabric_name=data["fabric"], kind=data["kind"],
            status=data["status"], nodes=nodes, refused=refused)
        return Response(GatewayAnswerSerializer(answer).data)

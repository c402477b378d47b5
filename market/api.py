"""REST API for prices (providers) and leases (tenants). Thin: validate, call a service,
serialize."""

import csv

from django.db.models import Count, Max, Min, Prefetch
from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from billing.api import DollarsField
from billing.core.money import to_dollars
from fabric import selectors as fabric_selectors
from fabric.core import qos
from fabric.core.locality import CONSTRAINT_LEVELS, Locality
from ibex.accounts.api import StrictSerializer
from ibex.accounts.permissions import Read, ReadOrProvide, ReadOrTrade, organization_of
from ibex.api.pagination import CursorPagination
from ibex.api.throttles import OrderThrottle
from market import leasing, market_data, offers, orders, parts, prices, quotes
from market.core import candles as candle_core
from market.core import offers_query
from market.core.workloads import MAX_SLURM_ACCOUNT_CHARS
from market.models import Clearing, GpuPrice, Lease, LeaseEvent, Order
from pool import workloads as pool_workloads
from pool.core.workloads import WORKLOAD_STATES
from pool.models import GpuModel

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
    shareable = serializers.BooleanField(
        required=False, allow_null=True, default=None,
        help_text="sell parts of these GPUs too: MIG slices (MIG-capable models) and shares; "
                  "omitted: as they are")
    price_per_slice_hour = serializers.DictField(
        child=DollarsField(), required=False, default=dict,
        help_text="MIG profile → its price per slice-hour; a profile not named costs the GPU's "
                  "price times its share of compute slices (e.g. 1g: 1/7)")

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
    price_per_slice_hour = serializers.SerializerMethodField()
    current = serializers.SerializerMethodField()

    class Meta:
        model = GpuPrice
        fields = ["id", "gpu", "price_per_gpu_hour", "price_per_slice_hour", "offered_from",
                  "offered_until", "min_lease_hours", "set_by", "set_at", "superseded_at",
                  "current"]

    def get_current(self, price) -> bool:
        return price.superseded_at is None

    @extend_schema_field(serializers.DictField(child=serializers.CharField()))
    def get_price_per_slice_hour(self, price) -> dict:
        """The MIG profiles priced per slice-hour by the provider (the others: by compute)."""
        return {name: to_dollars(micros) for name, micros in sorted(price.slice_prices.items())}


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
        change = prices.set_prices(
            provider=provider, scope=data["scope"], price_micros=data["price_per_gpu_hour"],
            offered_from=data["offered_from"], offered_until=data["offered_until"],
            min_lease_hours=data["min_lease_hours"], actor=request.user.get_username(),
            shareable=data["shareable"], slice_prices=data["price_per_slice_hour"])
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
    mig_profile = serializers.CharField(required=False, help_text="a MIG slice of this GPU")
    share = serializers.IntegerField(required=False,
                                     help_text="a share of this GPU, in thousandths")
    device = serializers.CharField(required=False, allow_null=True, help_text=(
        "a part: the device its node's agent made for it (a MIG device UUID), null until "
        "reported"))
    enforced = serializers.BooleanField(required=False, allow_null=True, help_text=(
        "a part: whether the node enforces it (false: the agent's `error` says why); null "
        "until reported"))
    error = serializers.CharField(required=False, allow_blank=True)


class LocalitySerializer(serializers.Serializer):
    leaves = serializers.IntegerField()
    spines = serializers.IntegerField()
    max_hops = serializers.IntegerField()


class RankSerializer(serializers.Serializer):
    node = serializers.CharField()
    node_rank = serializers.IntegerField()
    state = serializers.ChoiceField(choices=WORKLOAD_STATES)
    exit_code = serializers.IntegerField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_blank=True, help_text="why the rank could not run, as its "
                                                             "agent says (e.g. command not found)")


class LeaseWorkloadSerializer(serializers.Serializer):
    command = serializers.ListField(child=serializers.CharField())
    env = serializers.DictField(child=serializers.CharField())
    workdir = serializers.CharField(allow_blank=True)
    state = serializers.ChoiceField(choices=WORKLOAD_STATES)
    nodes = RankSerializer(many=True)


class LeaseAccessSerializer(serializers.Serializer):
    node = serializers.CharField()
    ssh = serializers.CharField(allow_null=True)
    slurm = serializers.CharField(allow_null=True, help_text=(
        "on a node of a Slurm cluster: the srun that runs a job in the lease's reservation"))


class LeaseLogSerializer(serializers.Serializer):
    node_rank = serializers.IntegerField()
    node = serializers.CharField(allow_null=True, help_text="null until the lease is on its nodes")
    lines = serializers.ListField(child=serializers.CharField(allow_blank=True))
    cursor = serializers.CharField(help_text="pass it back as `since` for the lines after these")
    dropped = serializers.IntegerField(help_text="lines lost before these (trimmed to the "
                                                 "rank's last 10 MiB, or lost by the agent)")
    more = serializers.BooleanField(help_text="more lines are ready: ask again at once")


class BandwidthOutSerializer(serializers.Serializer):
    class_ = serializers.CharField(help_text="guaranteed, standard or scavenger")
    gbps_per_gpu = serializers.FloatField(allow_null=True,
                                          help_text="guaranteed: Gb/s per GPU; else null")

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = fields.pop("class_")
        return fields


class DeliveredBandwidthSerializer(serializers.Serializer):
    last_interval = serializers.FloatField(allow_null=True, help_text=(
        "Gb/s its nodes' HCA ports sent over the fabric agent's last interval (PortXmitData); "
        "null when unknown: not measured yet, a counter reset or saturated, or it ended"))
    mean = serializers.FloatField(allow_null=True, help_text=(
        "Gb/s on average since it started, over every node it has been on"))
    sampled_at = serializers.DateTimeField(allow_null=True,
                                           help_text="the end of the last interval")
    shared = serializers.BooleanField(help_text=(
        "a node it is on serves another lease too: the node's whole traffic is shown"))


class LeaseFabricSerializer(serializers.Serializer):
    pkey = serializers.CharField(allow_null=True, help_text=(
        "the P_Key of the lease's InfiniBand partition (`0x1a2b`, without the full-member "
        "bit): its nodes' HCA ports are its full members; null on one node, and once it ended"))
    delivered_gbps = DeliveredBandwidthSerializer(help_text=(
        "the bandwidth its nodes delivered, measured from their HCA ports' counters "
        "(docs/fabric.md, \"Measured bandwidth and health\")"))


NOT_MEASURED = {"last_interval": None, "mean": None, "sampled_at": None, "shared": False}


class LeaseSerializer(serializers.ModelSerializer):
    price_per_gpu_hour = DollarsField(source="price_micros")
    max_price_per_gpu_hour = DollarsField(source="max_price_micros")
    gpus = serializers.SerializerMethodField()
    locality = serializers.SerializerMethodField()
    ended_at = serializers.SerializerMethodField()
    events = LeaseEventSerializer(many=True)
    workload = serializers.SerializerMethodField()
    access = serializers.SerializerMethodField()
    alternative = serializers.SerializerMethodField(
        help_text="the index of the shape of its bid that won; 0 for a bid of one shape")
    fabric = serializers.SerializerMethodField()
    bandwidth = serializers.SerializerMethodField()

    class Meta:
        model = Lease
        fields = ["id", "state", "tier", "gpu_model", "gpu_count", "mig_profile", "gpu_share",
                  "gpus", "locality",
                  "price_per_gpu_hour", "max_price_per_gpu_hour", "starts_at", "ends_at",
                  "ended_at", "preempt_at", "allow_moves", "created_at", "events", "workload",
                  "access", "slurm_account", "alternative", "fabric", "bandwidth"]

    @extend_schema_field(BandwidthOutSerializer)
    def get_bandwidth(self, lease) -> dict:
        """Its traffic class on the fabric, as its order asked (standard for a pool's)."""
        order = getattr(lease, "order", None)
        if order is None:
            return qos.bandwidth_json(qos.STANDARD, None)
        return qos.bandwidth_json(order.bandwidth_class, order.gbps_per_gpu)

    @extend_schema_field(LeaseFabricSerializer)
    def get_fabric(self, lease) -> dict:
        """Its place on the InfiniBand fabric: its partition's P_Key (docs/fabric.md)."""
        known = self.context.get("pkeys")
        if known is None:
            known = fabric_selectors.pkeys_of([lease.reference])
        delivered = self.context.get("delivered")
        if delivered is None:
            delivered = fabric_selectors.delivered_bandwidth([lease.reference])
        return {"pkey": known.get(lease.reference),
                "delivered_gbps": delivered.get(lease.reference, NOT_MEASURED)}

    def get_alternative(self, lease) -> int:
        """Which shape of its bid the lease is (0 unless a bid over alternatives won)."""
        order = getattr(lease, "order", None)  # None: a lease no order made (a pool's)
        return order.alternative or 0 if order is not None else 0

    def _bindings(self, lease) -> list:
        known = self.context.get("bindings")
        if known is not None and lease.reference in known:
            return known[lease.reference]
        return pool_workloads.bindings_by_lease([lease.reference])[lease.reference]

    @extend_schema_field(LeaseWorkloadSerializer(allow_null=True))
    def get_workload(self, lease) -> dict | None:
        """What its nodes run and each rank's state (docs/workloads.md); null without a
        command."""
        view = pool_workloads.workload_view(self._bindings(lease), lease.workload)
        if view is not None:
            view = LeaseWorkloadSerializer(view).data
        return view

    @extend_schema_field(LeaseAccessSerializer(many=True))
    def get_access(self, lease) -> list[dict]:
        """Per node it runs on, the SSH command that logs in (null where the node offers no
        SSH or the lease brought no keys), and on a Slurm node the srun for its reservation."""
        return pool_workloads.access_view(self._bindings(lease), lease.reference,
                                          bool(lease.ssh_keys), lease.slurm_account)

    @extend_schema_field(LeaseGpuSerializer(many=True))
    def get_gpus(self, lease) -> list[dict]:
        """The GPUs it holds now (earlier placements are in its events)."""
        held = in_force(lease)
        if not lease.mig_profile and lease.gpu_share is None:
            return [{"node": a.gpu.node.hostname, "index": a.gpu.index} for a in held]
        return pool_workloads.parts_view(parts.part_rows(held), self._bindings(lease))

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_ended_at(self, lease):
        """When it actually ended (terminated, completed, preempted, failed); null while it
        runs. `ends_at` stays the planned end."""
        if lease.state not in leasing.ENDED:
            return None
        return serializers.DateTimeField().to_representation(lease.state_changed_at)

    @extend_schema_field(LocalitySerializer)
    def get_locality(self, lease) -> dict:
        """Leaves, spines and hops spanned by the GPUs it holds now."""
        return Locality.of(map(leasing.allocation_key, in_force(lease))).to_json()


def in_force(lease) -> list:
    cached = getattr(lease, "in_force", None)
    return cached if cached is not None else list(
        leasing.allocations_in_force_with_places().filter(lease=lease))



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
        leases = Lease.objects.select_related("order").prefetch_related(
            "events", Prefetch("allocations", queryset=leasing.allocations_in_force_with_places(),
                               to_attr="in_force"))
        return leases if org.is_operator else leases.filter(tenant=org)

    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        leases = page if page is not None else list(self.filter_queryset(self.get_queryset()))
        # every lease's bindings in one query, not one per lease
        context = {**self.get_serializer_context(),
                   "bindings": pool_workloads.bindings_by_lease(lease.reference for lease in leases),
                   "pkeys": fabric_selectors.pkeys_of([lease.reference for lease in leases]),
                   "delivered": fabric_selectors.delivered_bandwidth(
                       [lease.reference for lease in leases])}
        data = LeaseSerializer(leases, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    @extend_schema(
        parameters=[
            OpenApiParameter("node_rank", int, description="the rank (0..n-1); default 0"),
            OpenApiParameter("since", str, description="the cursor of the previous page"),
        ],
        responses=LeaseLogSerializer, summary="A rank's output: tail it with the cursor")
    @action(detail=True, methods=["get"])
    def logs(self, request, pk=None):
        lease = self.get_object()
        node_rank = request.query_params.get("node_rank", "0")
        if not node_rank.isdigit() or int(node_rank) > 10_000:
            raise ValidationError({"node_rank": ["Must be a whole number from 0."]})
        try:
            page = pool_workloads.read_log(lease_ref=lease.reference, node_rank=int(node_rank),
                                           since=request.query_params.get("since"))
        except pool_workloads.BadCursor as exc:
            raise ValidationError({"since": [str(exc)]}) from None
        except pool_workloads.NoSuchRank as exc:
            raise ValidationError({"node_rank": [str(exc)]}) from None
        return Response(LeaseLogSerializer(page).data)

    @extend_schema(request=None, responses=LeaseSerializer, summary="End the lease now")
    @action(detail=True, methods=["post"])
    def terminate(self, request, pk=None):
        lease = self.get_object()
        leasing.terminate_lease(lease=lease, actor=request.user.get_username())
        return Response(LeaseSerializer(self.get_queryset().get(pk=lease.pk)).data)

    @extend_schema(request=ExtendSerializer, responses=LeaseSerializer,
                   summary="Extend the lease when its GPUs stay free")
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        lease = self.get_object()
        form = ExtendSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        leasing.extend_lease(lease=lease, hours=form.validated_data["hours"],
                             actor=request.user.get_username())
        return Response(LeaseSerializer(self.get_queryset().get(pk=lease.pk)).data)



# --- orders -------------------------------------------------------------------------------------


class TopologySerializer(StrictSerializer):
    required = serializers.ChoiceField(choices=CONSTRAINT_LEVELS, required=False)
    preferred = serializers.ChoiceField(choices=CONSTRAINT_LEVELS, required=False)
    whole_nodes = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs):
        if attrs.get("required") and attrs.get("preferred"):
            raise serializers.ValidationError(
                {"preferred": ["Give either required or preferred, not both."]})
        return attrs


class StartWindowSerializer(StrictSerializer):
    earliest = serializers.DateTimeField()
    latest = serializers.DateTimeField()

    def validate(self, attrs):
        if attrs["latest"] < attrs["earliest"]:
            raise serializers.ValidationError({"latest": ["The window ends before it starts."]})
        return attrs


class WorkloadSerializer(StrictSerializer):
    """The shape of a workload; market.core.workloads checks the rest (reserved names, sizes)."""

    command = serializers.ListField(child=serializers.CharField(trim_whitespace=False,
                                                                allow_blank=True),
                                    min_length=1, max_length=1024,
                                    help_text="the command line as a list, never through a shell")
    env = serializers.DictField(child=serializers.CharField(trim_whitespace=False,
                                                            allow_blank=True),
                                required=False, default=dict,
                                help_text="variables added to the launch environment (64 KiB)")
    workdir = serializers.CharField(required=False, default="", allow_blank=True,
                                    trim_whitespace=False, max_length=255,
                                    help_text="relative to the lease's home")


PRODUCT_FIELDS = ("gpus", "mig_profile", "gpu_share")


def _check_product(attrs: dict) -> None:
    """Exactly one of whole GPUs, MIG slices or shares; a count with parts, none with GPUs;
    parts on demand or spot only."""
    named = [name for name in PRODUCT_FIELDS if name in attrs]
    if len(named) != 1:
        message = ("Give exactly one of gpus, mig_profile (with count) or gpu_share (with "
                   "count).")
        raise serializers.ValidationError({name: [message] for name in (named or PRODUCT_FIELDS)})
    if named == ["gpus"] and "count" in attrs:
        raise serializers.ValidationError(
            {"count": ["count goes with mig_profile or gpu_share; whole GPUs are `gpus`."]})
    if named != ["gpus"]:
        if "count" not in attrs:
            raise serializers.ValidationError(
                {"count": [f"How many: {named[0]} needs a count."]})
        if attrs["tier"] not in (Lease.Tier.ON_DEMAND, Lease.Tier.SPOT):
            raise serializers.ValidationError(
                {"tier": ["Slices and shares are sold on demand or spot, not reserved."]})


class BandwidthSerializer(StrictSerializer):
    """`{"class": "guaranteed", "gbps_per_gpu": 50}`, `{"class": "standard"}` (the default) or
    `{"class": "scavenger"}` (docs/fabric.md, "Bandwidth classes"); market.orders checks the
    guarantee against the fabrics."""

    class_ = serializers.ChoiceField(choices=qos.CLASSES, help_text=(
        "guaranteed: gbps_per_gpu reserved on every link of the lease's routes; standard: "
        "shares the rest; scavenger: uses what nobody else does"))
    gbps_per_gpu = serializers.DecimalField(
        max_digits=6, decimal_places=1, required=False, allow_null=True, default=None,
        coerce_to_string=False, help_text="guaranteed only: Gb/s per GPU")

    def get_fields(self):
        fields = super().get_fields()
        fields["class"] = fields.pop("class_")  # `class` is the contract's name
        return fields


SHAPE_FIELDS = ("gpu_models", "gpus", "mig_profile", "gpu_share", "count", "hours",
                "max_price_per_gpu_hour", "topology")


class AlternativeSerializer(StrictSerializer):
    """One shape of an auction bid over alternatives: at most one of a bid's shapes wins."""

    gpu_models = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1,
                                       max_length=10)
    gpus = serializers.IntegerField(min_value=1, max_value=100_000)
    hours = serializers.IntegerField(min_value=1, max_value=8760)
    max_price_per_gpu_hour = DollarsField()
    topology = TopologySerializer(required=False)

    def validate_max_price_per_gpu_hour(self, micros):
        if micros < 0:
            raise serializers.ValidationError("A limit cannot be negative.")
        return micros


def _check_alternatives(attrs: dict) -> None:
    """A bid gives one shape or alternatives, never both (`market.orders` checks the rest:
    how many, the tier, the pool, each shape's market and size)."""
    given = [name for name in SHAPE_FIELDS if name in attrs]
    if given:
        raise serializers.ValidationError({"alternatives": [
            f"Give either one shape ({', '.join(given)}) or alternatives, not both."]})


class OrderCreateSerializer(StrictSerializer):
    gpu_models = serializers.ListField(child=serializers.CharField(max_length=40), min_length=1,
                                       max_length=10, required=False)
    gpus = serializers.IntegerField(min_value=1, max_value=100_000, required=False,
                                    help_text="whole GPUs; or give mig_profile or gpu_share "
                                              "with count")
    mig_profile = serializers.CharField(
        max_length=20, required=False, help_text="MIG slices of this profile (e.g. 1g.10gb), "
                                                 "`count` of them, on one node")
    gpu_share = serializers.IntegerField(
        min_value=1, max_value=999, required=False,
        help_text="shares of a GPU in thousandths of its compute, with the same share of its "
                  "memory; `count` of them, on distinct GPUs of one node")
    count = serializers.IntegerField(min_value=1, max_value=64, required=False,
                                     help_text="how many slices or shares")
    hours = serializers.IntegerField(min_value=1, max_value=8760, required=False)
    tier = serializers.ChoiceField(choices=Lease.Tier.choices)
    max_price_per_gpu_hour = DollarsField(required=False,
                                          help_text="per GPU-hour; for slices and shares, per "
                                                    "slice-hour or share-hour")
    topology = TopologySerializer(required=False)
    alternatives = AlternativeSerializer(
        many=True, required=False,
        help_text="instead of one shape (gpu_models, gpus, hours, max_price_per_gpu_hour, "
                  "topology): 2 to 8 shapes, each with its own, of which at most one wins; "
                  "spot and reserved bids only")
    start_window = StartWindowSerializer(required=False, allow_null=True, default=None)
    fill = serializers.ChoiceField(choices=Order.Fill.choices, default=Order.Fill.FILL_OR_KILL)
    pool = serializers.SlugField(max_length=100, required=False, default="",
                                 help_text="a private pool where you hold quota: priced in "
                                           "quota (give max_price_per_gpu_hour 0.00)")
    queue = serializers.SlugField(max_length=100, required=False, default="",
                                  help_text="your quota queue in that pool (if you have several)")
    priority = serializers.IntegerField(min_value=0, max_value=1000, required=False, default=0,
                                        help_text="private pools: higher is admitted first")
    priority_class = serializers.SlugField(
        max_length=100, required=False, default="",
        help_text="private pools: a named priority of the pool (its value is the priority)")
    allow_moves = serializers.BooleanField(
        required=False, allow_null=True, default=None,
        help_text="let the scheduler move the lease for planned work (draining a node, "
                  "defragmentation); default: true for spot, false for on-demand and reserved")
    workload = WorkloadSerializer(required=False, allow_null=True, default=None,
                                  help_text="what the lease's nodes run, one process per node")
    ssh_keys = serializers.ListField(
        child=serializers.CharField(trim_whitespace=False), required=False, default=list,
        max_length=16, help_text="OpenSSH public keys (ed25519, ecdsa, rsa of 2048 bits or more) "
                                 "let into the lease's nodes")
    slurm_account = serializers.CharField(
        required=False, default="", allow_blank=True, trim_whitespace=False,
        max_length=MAX_SLURM_ACCOUNT_CHARS,
        help_text="the Slurm account (or user) the lease's reservation is made for on nodes of a "
                  "Slurm cluster, which take only orders that name one: letters, digits, _ . -, "
                  "starting with a letter, digit or _")
    bandwidth = BandwidthSerializer(required=False, help_text=(
        "its traffic class on the InfiniBand fabric; default {\"class\": \"standard\"}"))

    def validate_max_price_per_gpu_hour(self, micros):
        if micros < 0:
            raise serializers.ValidationError("A limit cannot be negative.")
        return micros

    def validate(self, attrs):
        if "alternatives" in attrs:
            _check_alternatives(attrs)
        else:
            _check_product(attrs)
            missing = [name for name in ("gpu_models", "hours", "max_price_per_gpu_hour")
                       if name not in attrs]
            if missing:
                raise serializers.ValidationError(
                    {name: ["This field is required."] for name in missing})
        if attrs.get("priority_class") and not attrs.get("pool"):
            raise serializers.ValidationError(
                {"priority_class": ["Priority classes belong to private pools: name the pool."]})
        if attrs["tier"] == Lease.Tier.RESERVED and not attrs.get("start_window"):
            raise serializers.ValidationError(
                {"start_window": ["A reserved order needs a start window."]})
        return attrs

    def to_request(self, idempotency_key: str) -> orders.OrderRequest:
        data = self.validated_data
        window = data.get("start_window") or {}
        common = dict(
            tier=data["tier"], start_earliest=window.get("earliest"),
            start_latest=window.get("latest"), fill=data["fill"],
            idempotency_key=idempotency_key, pool=data["pool"], queue=data["queue"],
            priority=data["priority"], priority_class=data["priority_class"],
            allow_moves=data["allow_moves"],
            workload=dict(data["workload"]) if data.get("workload") is not None else None,
            ssh_keys=list(data["ssh_keys"]), slurm_account=data["slurm_account"],
            bandwidth_class=data.get("bandwidth", {}).get("class", qos.STANDARD),
            gbps_per_gpu=data.get("bandwidth", {}).get("gbps_per_gpu"),
        )
        if "alternatives" in data:
            return orders.over_alternatives(alternatives=[
                {"gpu_models": list(shape["gpu_models"]), "gpus": shape["gpus"],
                 "hours": shape["hours"], "max_price_micros": shape["max_price_per_gpu_hour"],
                 "topology": dict(shape.get("topology") or {})}
                for shape in data["alternatives"]], **common)
        return orders.OrderRequest(
            gpu_models=data["gpu_models"], gpus=data.get("gpus") or data["count"],
            mig_profile=data.get("mig_profile", ""), gpu_share=data.get("gpu_share"),
            hours=data["hours"], max_price_micros=data["max_price_per_gpu_hour"],
            topology=dict(data.get("topology") or {}), **common)


class AlternativeOutSerializer(serializers.Serializer):
    gpu_models = serializers.ListField(child=serializers.CharField())
    gpus = serializers.IntegerField()
    hours = serializers.IntegerField()
    max_price_per_gpu_hour = DollarsField(source="max_price_micros")
    topology = serializers.DictField()


class OrderSerializer(serializers.ModelSerializer):
    max_price_per_gpu_hour = DollarsField(source="max_price_micros")
    bandwidth = serializers.SerializerMethodField()
    alternatives = AlternativeOutSerializer(many=True, read_only=True)
    price_to_win = serializers.SerializerMethodField(
        help_text="refused at the last clearing: the lowest limit per GPU-hour at which it "
                  "would have won, all else the same; null with price_to_win_reason when no "
                  "limit would have")
    lease = serializers.PrimaryKeyRelatedField(read_only=True)
    start_window = serializers.SerializerMethodField()
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    queue = serializers.SlugRelatedField(source="quota_node", slug_field="name", read_only=True)
    priority_class = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Order
        fields = ["id", "state", "reason", "lease", "gpu_models", "gpus", "mig_profile",
                  "gpu_share", "hours", "tier",
                  "max_price_per_gpu_hour", "topology", "start_window", "fill", "pool", "queue",
                  "priority", "priority_class", "queue_position", "allow_moves", "workload", "ssh_keys",
                  "slurm_account", "alternatives", "alternative", "price_to_win",
                  "price_to_win_reason", "bandwidth", "created_at"]

    @extend_schema_field(BandwidthOutSerializer)
    def get_bandwidth(self, order) -> dict:
        return qos.bandwidth_json(order.bandwidth_class, order.gbps_per_gpu)

    def get_price_to_win(self, order) -> str | None:
        return None if order.price_to_win_micros is None else to_dollars(order.price_to_win_micros)

    @extend_schema_field(StartWindowSerializer(allow_null=True))
    def get_start_window(self, order) -> dict | None:
        if order.start_earliest is None:
            return None
        return {"earliest": order.start_earliest, "latest": order.start_latest}


class OrderViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A tenant's orders; another organisation's order is a 404."""

    serializer_class = OrderSerializer
    permission_classes = [ReadOrTrade]
    filterset_fields = ["state", "tier"]

    def get_throttles(self):
        extra = [OrderThrottle()] if self.action == "create" else []
        return [*super().get_throttles(), *extra]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Order.objects.none()
        org = organization_of(self.request)
        orders_ = Order.objects.select_related("pool", "quota_node", "priority_class")
        return orders_ if org.is_operator else orders_.filter(tenant=org)

    @extend_schema(request=OrderCreateSerializer, responses={201: OrderSerializer,
                                                            200: OrderSerializer},
                   parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER,
                                                required=False)],
                   summary="Place an order: on-demand fills at once; spot and reserved wait "
                           "for the next clearing")
    def create(self, request):
        tenant = organization_of(request)
        if not tenant.is_tenant:
            raise PermissionDenied("Only tenants place orders.")
        key = request.headers.get("Idempotency-Key", "")
        if len(key) > 100:
            raise serializers.ValidationError({"Idempotency-Key": ["At most 100 characters."]})
        replay = bool(key) and Order.objects.filter(tenant=tenant, idempotency_key=key).exists()
        form = OrderCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        order = orders.place_order(tenant=tenant, request=form.to_request(key),
                                   actor=request.user.get_username())
        return Response(OrderSerializer(order).data,
                        status=status.HTTP_200_OK if replay else status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=OrderSerializer, summary="Cancel an unfilled order")
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        order = orders.cancel_order(order=self.get_object(),
                                    actor=request.user.get_username())
        return Response(OrderSerializer(order).data)


# --- markets ------------------------------------------------------------------------------------


class ClearingSerializer(serializers.ModelSerializer):
    price_per_gpu_hour = serializers.SerializerMethodField()
    accepted = serializers.SerializerMethodField()
    refused = serializers.SerializerMethodField()
    welfare = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True,
                                       read_only=True, help_text="dollars: what the winners "
                                       "would pay at their limits less the GPUs' reserves, "
                                       "over their hours")
    welfare_bound = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True,
                                             read_only=True, help_text="no clearing of this "
                                             "book has more welfare")
    gap = serializers.DecimalField(max_digits=9, decimal_places=6, allow_null=True,
                                   read_only=True, help_text="(bound - welfare) / bound: the "
                                   "welfare is certified within this of the best")

    class Meta:
        model = Clearing
        fields = ["id", "gpu_model", "interval_start", "cleared_at", "price_per_gpu_hour",
                  "gpus_sold", "accepted", "refused", "welfare", "welfare_bound", "gap",
                  "optimal", "exact"]

    def get_price_per_gpu_hour(self, row) -> str | None:
        return None if row.price_micros is None else to_dollars(row.price_micros)

    def get_accepted(self, row) -> int:
        return len(row.accepted)

    def get_refused(self, row) -> int:
        return len(row.refused)


class PaginatedClearingSerializer(serializers.Serializer):
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = ClearingSerializer(many=True)


class MarketSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    offered_gpus = serializers.IntegerField()
    free_gpus = serializers.IntegerField()
    on_demand_min = serializers.CharField(allow_null=True)
    on_demand_max = serializers.CharField(allow_null=True)
    last_clearing = ClearingSerializer(allow_null=True)


class BookLevelSerializer(serializers.Serializer):
    price_per_gpu_hour = DollarsField(source="price_micros",
                                      help_text="the bids' limit per GPU-hour")
    topology = serializers.ChoiceField(choices=candle_core.TOPOLOGY_ORDER,
                                       help_text="the level the bids require their GPUs in")
    bids = serializers.IntegerField()
    gpus = serializers.IntegerField()
    gpu_hours = serializers.IntegerField()


class BookSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    next_clearing = serializers.DateTimeField(
        help_text="the start of the interval whose clearing takes these bids")
    levels = BookLevelSerializer(many=True, help_text="the highest price first")


class CandleSerializer(serializers.Serializer):
    interval_start = serializers.DateTimeField()
    interval_end = serializers.DateTimeField()
    open = DollarsField(allow_null=True, help_text="the first clearing price of the interval; "
                                                   "null: no clearing had a price")
    high = DollarsField(allow_null=True)
    low = DollarsField(allow_null=True)
    close = DollarsField(allow_null=True, help_text="the last clearing price of the interval")
    clearings = serializers.IntegerField()
    gpus_sold = serializers.IntegerField()
    gpu_hours_sold = serializers.IntegerField()


# `from` and `to` are Python keywords: the class is built from a dict
CandlesSerializer = type("CandlesSerializer", (serializers.Serializer,), {
    "__module__": __name__,
    "gpu_model": serializers.CharField(),
    "interval": serializers.ChoiceField(choices=list(candle_core.INTERVALS)),
    "from": serializers.DateTimeField(help_text="the first interval's start"),
    "to": serializers.DateTimeField(help_text="the last interval's end (exclusive)"),
    "candles": CandleSerializer(many=True, help_text="oldest first"),
})

FORMAT_PARAMETER = OpenApiParameter("format", str, enum=list(candle_core.FORMATS),
                                    default="json", description="csv: text/csv, a header row "
                                                                "of the same fields")


class MarketViewSet(viewsets.ViewSet):
    """Public market data: per GPU model, offered and free GPUs, posted prices and the
    latest clearing; `history/` lists every clearing of one market, `book/` the bids of its
    next clearing, `candles/` its prices per hour or day."""

    permission_classes = [AllowAny]
    lookup_field = "gpu_model"
    lookup_value_regex = "[A-Za-z0-9.-]+"

    @extend_schema(responses=MarketSerializer(many=True))
    def list(self, request):
        names = list(GpuModel.objects.order_by("name").values_list("name", flat=True))
        return Response(market_summaries(names))

    @extend_schema(responses=PaginatedClearingSerializer)
    @action(detail=True, methods=["get"])
    def history(self, request, gpu_model=None):
        if not GpuModel.objects.filter(name=gpu_model).exists():
            raise NotFound(f"No market for {gpu_model}.")
        rows = Clearing.objects.filter(gpu_model=gpu_model)
        paginator = CursorPagination()
        paginator.ordering = "-interval_start"
        page = paginator.paginate_queryset(rows, request, view=self)
        return paginator.get_paginated_response(ClearingSerializer(page, many=True).data)

    @extend_schema(parameters=[FORMAT_PARAMETER],
                   responses={(200, "application/json"): BookSerializer,
                              (200, "text/csv"): OpenApiTypes.STR},
                   summary="The order book of the next clearing: bids summed per price and "
                           "required topology, no bidder named")
    @action(detail=True, methods=["get"])
    def book(self, request, gpu_model=None):
        self._market(gpu_model)
        fmt = _market_data_format(request)
        now = timezone.now()
        body = BookSerializer({
            "gpu_model": gpu_model,
            "next_clearing": market_data.next_clearing(gpu_model=gpu_model, now=now),
            "levels": market_data.book_rows(gpu_model=gpu_model, now=now)}).data
        if fmt == "csv":
            return _csv(body["levels"], BookLevelSerializer, f"{gpu_model}-book.csv")
        return Response(body)

    @extend_schema(parameters=[
        OpenApiParameter("interval", str, enum=[*candle_core.INTERVALS],
                         default=candle_core.DEFAULT_INTERVAL,
                         description="an hour (on the hour, UTC) or a day (from 00:00 UTC)"),
        OpenApiParameter("from", OpenApiTypes.DATETIME, description=(
            "ISO 8601 date or time (UTC without a zone), moved back to its interval's start; "
            "default: 24 hours or 30 days before `to`")),
        OpenApiParameter("to", OpenApiTypes.DATETIME, description=(
            "exclusive, moved on to its interval's end; default: the end of the interval "
            f"running now. At most {candle_core.MAX_CANDLES} intervals from `from`")),
        FORMAT_PARAMETER,
    ], responses={(200, "application/json"): CandlesSerializer,
                  (200, "text/csv"): OpenApiTypes.STR},
        summary="Candles: open, high, low, close of clearing prices and what sold, per "
                "interval (empty ones included)")
    @action(detail=True, methods=["get"])
    def candles(self, request, gpu_model=None):
        self._market(gpu_model)
        fmt = _market_data_format(request)
        params = request.query_params
        try:
            rng = candle_core.candle_range(interval=params.get("interval"),
                                           start=params.get("from"), end=params.get("to"),
                                           now=timezone.now())
        except candle_core.MarketDataError as exc:
            raise ValidationError({exc.param: [exc.message]}) from None
        rows = [_candle_row(c) for c in market_data.candles(gpu_model=gpu_model, rng=rng)]
        body = CandlesSerializer({"gpu_model": gpu_model, "interval": rng.interval,
                                  "from": rng.start, "to": rng.end, "candles": rows}).data
        if fmt == "csv":
            return _csv(body["candles"], CandleSerializer,
                        f"{gpu_model}-candles-{rng.interval}.csv")
        return Response(body)

    @staticmethod
    def _market(gpu_model: str) -> None:
        if not GpuModel.objects.filter(name=gpu_model).exists():
            raise NotFound(f"No market for {gpu_model}.")


def _market_data_format(request) -> str:
    try:
        return candle_core.check_format(request.query_params.get("format"))
    except candle_core.MarketDataError as exc:
        raise ValidationError({exc.param: [exc.message]}) from None


def _candle_row(candle) -> dict:
    return {"interval_start": candle.start, "interval_end": candle.end, "open": candle.open,
            "high": candle.high, "low": candle.low, "close": candle.close,
            "clearings": candle.clearings, "gpus_sold": candle.gpus_sold,
            "gpu_hours_sold": candle.gpu_hours_sold}


def _csv(rows: list[dict], serializer: type[serializers.Serializer], name: str) -> HttpResponse:
    """The rows as CSV: a header of the JSON's field names, an empty cell for null."""
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{name}"'
    writer = csv.DictWriter(response, fieldnames=list(serializer().fields))
    writer.writeheader()
    writer.writerows(rows)
    return response


def market_summary(gpu_model: str) -> dict:
    return market_summaries([gpu_model])[0]


def market_summaries(gpu_models: list[str]) -> list[dict]:
    """Each market's public figures, in four queries whatever the number of markets (the
    market page and `GET /markets/` are the most read answers of the exchange)."""
    now = timezone.now()
    offered = prices.gpus_for_sale(now=now).filter(gpu_model__name__in=gpu_models)
    totals = dict(offered.values_list("gpu_model__name").annotate(n=Count("id")).order_by())
    busy = dict(offered.filter(allocations__period__contains=now)
                .values_list("gpu_model__name").annotate(n=Count("id", distinct=True)).order_by())
    priced = {row["gpu__gpu_model__name"]: row for row in
              GpuPrice.objects.filter(gpu__in=offered, superseded_at__isnull=True)
              .values("gpu__gpu_model__name").annotate(low=Min("price_micros"),
                                                       high=Max("price_micros")).order_by()}
    last = {c.gpu_model: c for c in Clearing.objects.filter(gpu_model__in=gpu_models)
            .order_by("gpu_model", "-interval_start").distinct("gpu_model")}
    summaries = []
    for gpu_model in gpu_models:
        total, price = totals.get(gpu_model, 0), priced.get(gpu_model, {})
        summaries.append({
            "gpu_model": gpu_model, "offered_gpus": total,
            "free_gpus": total - busy.get(gpu_model, 0),
            "on_demand_min": None if price.get("low") is None else to_dollars(price["low"]),
            "on_demand_max": None if price.get("high") is None else to_dollars(price["high"]),
            "last_clearing": (ClearingSerializer(last[gpu_model]).data
                              if gpu_model in last else None),
        })
    return summaries


# --- offers and quotes (the `ibex` CLI; docs/api-offers.md) -------------------------------------


class OfferSerializer(serializers.Serializer):
    model = serializers.CharField()
    fabric = serializers.CharField(required=False, help_text="grouped by fabric or leaf")
    leaf = serializers.CharField(required=False, help_text="grouped by leaf")
    provider = serializers.CharField(required=False, help_text="grouped by provider (slug)")
    gpus = serializers.IntegerField(help_text="free GPUs in the group")
    price_per_gpu_hour = serializers.CharField(help_text="the cheapest free GPU's price")
    max_price_per_gpu_hour = serializers.CharField(help_text="the dearest free GPU's price")
    leaf_free = serializers.IntegerField(help_text="most free GPUs in one leaf of the group")
    spine_free = serializers.IntegerField(help_text="most free GPUs in one spine of the group")
    reliability = serializers.CharField(
        allow_null=True, help_text="the lowest of its providers' measured GPU availability over "
                                   "30 days, 0-1 to four places; null: nothing measured")
    mig_profiles = serializers.ListField(child=serializers.CharField(),
                                         help_text="MIG profiles its GPUs sell")
    shares = serializers.BooleanField(help_text="its GPUs sell shares")


class OfferListSerializer(serializers.Serializer):
    results = OfferSerializer(many=True)
    count = serializers.IntegerField(help_text="groups that matched, before the limit")


class OneObjectSchema(AutoSchema):
    """The schema of a `list` action that answers one object (its results and a count), not
    an array of them."""

    def _is_list_view(self, serializer=None) -> bool:
        return False


class OfferViewSet(viewsets.ViewSet):
    """Free capacity of the public market, grouped and filtered by a query."""

    permission_classes = [Read]
    schema = OneObjectSchema()

    @extend_schema(
        parameters=[
            OpenApiParameter("q", str, description=(
                "terms `field op value` separated by spaces, all must hold; fields: "
                + ", ".join(offers_query.FIELD_NAMES) + "; ops =, !=, <, <=, >, >=, in "
                "(with a list [a,b]); e.g. `model=H100-80GB gpus>=64 price<=2.50`")),
            OpenApiParameter("group_by", str, description=(
                "comma list of " + ", ".join(offers_query.GROUP_KEYS) + "; default model "
                "(always included); leaf adds fabric")),
            OpenApiParameter("sort", str, description=(
                "a group key or one of " + ", ".join(offers_query.SORT_FIELDS)
                + "; - before or after for descending; default price")),
            OpenApiParameter("limit", int, description=(
                f"1-{offers_query.MAX_LIMIT}, default {offers_query.DEFAULT_LIMIT}")),
        ],
        responses=OfferListSerializer, summary="Find free capacity (groups of free GPUs)")
    def list(self, request):
        params = request.query_params
        try:
            query = offers_query.parse_offers_query(
                q=params.get("q"), group_by=params.get("group_by"), sort=params.get("sort"),
                limit=params.get("limit"))
        except offers_query.QueryError as exc:
            raise ValidationError({exc.param: [exc.message]}) from None
        return Response(offers.find_offers(query))


class QuoteLocalitySerializer(serializers.Serializer):
    leaves = serializers.IntegerField()
    spines = serializers.IntegerField()
    max_hops = serializers.IntegerField()


class QuotePlacementSerializer(serializers.Serializer):
    node = serializers.CharField()
    index = serializers.IntegerField()
    mig_profile = serializers.CharField(required=False, help_text="a MIG slice of this GPU")
    share = serializers.IntegerField(required=False, help_text="a share, in thousandths")


class QuoteSerializer(serializers.Serializer):
    fillable = serializers.BooleanField()
    tier = serializers.ChoiceField(choices=Lease.Tier.choices)
    gpus = serializers.IntegerField(help_text="GPUs, or parts (slices or shares)")
    price_per_gpu_hour = serializers.CharField(allow_null=True, help_text=(
        "on demand: the lease's price; spot and reserved: the least the clearing would ask"))
    total = serializers.CharField(allow_null=True, help_text="price × gpus × hours")
    locality = QuoteLocalitySerializer(allow_null=True)
    placement = QuotePlacementSerializer(many=True)
    reason = serializers.CharField(allow_blank=True, help_text=(
        "why it is not fillable; for spot and reserved, what the clearing decides"))


class QuoteViewSet(viewsets.ViewSet):
    """What an order would get now: the order's body, nothing placed or held."""

    permission_classes = [Read]

    @extend_schema(request=OrderCreateSerializer, responses={200: QuoteSerializer},
                   summary="Quote an order: what it would get now, placing nothing")
    def create(self, request):
        tenant = organization_of(request)
        if not tenant.is_tenant:
            raise PermissionDenied("Only tenants ask for quotes.")
        form = OrderCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        quote = quotes.quote_order(tenant=tenant, request=form.to_request(""))
        return Response(quote.to_json())

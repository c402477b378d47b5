"""InfiniBand fabrics, modelled as NetBox models data-centre gear: device → port → link.

A port is on at most one link (the link and its end are unique together, and a port holds one
link), a link never joins a device to itself (its two ends carry different device GUIDs), and
GUIDs are unique per fabric: all enforced by PostgreSQL, not only by the importer.
"""

from decimal import Decimal

from django.db import models
from django.db.models import Q

from fabric.core import qos
from ibex.accounts.models import Organization

# P_Keys IBEX may give (15 bits; OpenSM adds the full-member bit 0x8000): 0x0000 is invalid and
# 0x7fff is the default partition.
PKEY_MIN, PKEY_MAX = 0x0001, 0x7FFE
PKEY_FIRST, PKEY_LAST = 0x1000, 0x7FFE
ERROR_THRESHOLD_DEFAULT, ERROR_THRESHOLD_MAX = 10, 1_000_000  # errors per minute on a link


class Fabric(models.Model):
    class Kind(models.TextChoices):
        FAT_TREE = "fat-tree"
        RAIL_OPTIMISED = "rail-optimised"
        DRAGONFLY = "dragonfly"
        TORUS = "torus"
        SINGLE_SWITCH = "single-switch"

    class Source(models.TextChoices):
        IBNETDISCOVER = "ibnetdiscover"
        SLURM = "slurm"
        GENERATOR = "generator"

    owner = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="fabrics")
    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    link_rate_gbps = models.DecimalField(
        max_digits=7, decimal_places=1, null=True, blank=True,
        help_text="the most common link rate: HDR 200, NDR 400, XDR 800",
    )
    source = models.CharField(max_length=20, choices=Source.choices)
    summary = models.JSONField(default=dict, help_text="levels, domain counts, rates, oversubscription")
    torus_dims = models.JSONField(null=True, blank=True)
    # A fabric run by a scheduler (Slurm) is watched by one gateway for all its nodes
    # (`ibex-agent slurm`): what it last said of the scheduler, and when.
    gateway = models.CharField(max_length=10, blank=True,
                               help_text='"slurm" when a Slurm gateway reports its nodes')
    gateway_status = models.CharField(max_length=300, blank=True,
                                      help_text='"ok", or what is wrong, e.g. "slurm unreachable: ..."')
    gateway_seen_at = models.DateTimeField(null=True, blank=True)
    # The fabric agent (`ibex-agent fabric`, beside the subnet manager) reads the live fabric
    # every interval: when it last reported, whether that poll reached the fabric, and what IBEX
    # then knew of the fabric itself (docs/fabric.md).
    agent_seen_at = models.DateTimeField(null=True, blank=True,
                                         help_text="when the fabric agent last reported")
    agent_reachable = models.BooleanField(null=True, blank=True,
                                          help_text="whether its last poll reached the fabric")
    agent_error = models.CharField(max_length=500, blank=True,
                                   help_text="why its last poll did not reach the fabric")
    live_seen_at = models.DateTimeField(null=True, blank=True,
                                        help_text="when the agent last read the fabric (its clock)")
    live_topology_hash = models.CharField(max_length=80, blank=True,
                                          help_text="the hash of the topology IBEX last took")
    live_summary = models.JSONField(default=dict, blank=True,
                                    help_text="links per state, cables IBEX does not know, "
                                              "counters stored, the subnet manager")
    # Partitions (docs/fabric.md, "Partitions"): every lease on more than one node gets a P_Key
    # of this range; the provider's own partition lines (as the fabric agent last read them
    # from partitions.conf) are never given out.
    pkey_first = models.PositiveIntegerField(default=PKEY_FIRST,
                                             help_text="the lowest P_Key IBEX gives a lease")
    pkey_last = models.PositiveIntegerField(default=PKEY_LAST,
                                            help_text="the highest P_Key IBEX gives a lease")
    provider_pkeys = models.JSONField(default=list, blank=True,
                                      help_text="P_Keys of the provider's own partition lines "
                                                "(15 bits), as the fabric agent read them")
    # Link health (docs/fabric.md, "Measured bandwidth and health"): a link whose ends count
    # more errors than this per minute (SymbolErrorCounter, PortRcvErrors, LinkDownedCounter)
    # is faulty, like one that is down.
    error_threshold = models.PositiveIntegerField(
        default=ERROR_THRESHOLD_DEFAULT,
        help_text="errors per minute on a link (both ends) above which it is faulty")
    # Bandwidth classes (docs/fabric.md, "Bandwidth classes"): the provider's SLs, VLs and
    # VL-arbitration weights; empty: IBEX's defaults (fabric.core.qos.DEFAULT_SETTINGS).
    qos = models.JSONField(default=dict, blank=True,
                           help_text="the provider's QoS settings (validated by fabric.core.qos)")
    # Admission on the real routes (docs/fabric.md): the share of each link's rate that
    # guarantees may take together.
    guarantee_ratio = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.8"),
        help_text="guarantees on a link may sum to its rate × this (0 < ratio ≤ 1)")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(guarantee_ratio__gt=0, guarantee_ratio__lte=1),
                                   name="fabric_guarantee_ratio_in_0_1"),
            models.CheckConstraint(
                condition=Q(pkey_first__gte=PKEY_MIN, pkey_first__lte=models.F("pkey_last"),
                            pkey_last__lte=PKEY_MAX),
                name="fabric_pkey_range_valid",
            ),
        ]

    def __str__(self):
        return self.name


class FabricRoutes(models.Model):
    """The fabric's routes as the agent last read them (docs/fabric.md, "Routes"): every node's
    LID and every switch's unicast forwarding table, one hex string a switch (two digits a LID,
    `fabric.core.routes.encode_table`). One row a fabric, rewritten only when the routes change:
    1,920 hosts under 92 switches is about 370 kB."""

    fabric = models.OneToOneField(Fabric, on_delete=models.CASCADE, related_name="routes")
    routes_hash = models.CharField(max_length=80)
    observed_at = models.DateTimeField(help_text="the poll that read them (the agent's clock)")
    lids = models.JSONField(default=dict, help_text="node GUID -> LID")
    tables = models.JSONField(default=dict, help_text="switch GUID -> out port per LID, in hex")

    def __str__(self):
        return f"routes of {self.fabric_id}"


class Switch(models.Model):
    class Tier(models.TextChoices):
        LEAF = "leaf"
        SPINE = "spine"
        CORE = "core"
        ROUTER = "router"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="switches")
    guid = models.CharField(max_length=40)
    name = models.CharField(max_length=200)
    tier = models.CharField(max_length=10, choices=Tier.choices)
    port_count = models.PositiveIntegerField(default=0)
    group = models.CharField(max_length=100, blank=True, help_text="dragonfly group")
    coords = models.JSONField(null=True, blank=True, help_text="torus position [x, y, z]")

    class Meta:
        ordering = ["fabric", "name"]
        constraints = [
            models.UniqueConstraint(fields=["fabric", "guid"], name="switch_guid_unique_per_fabric"),
        ]
        indexes = [models.Index(fields=["fabric", "tier"])]

    def __str__(self):
        return f"{self.name} ({self.guid})"


class Host(models.Model):
    """A GPU server as the fabric sees it, with its domain at each locality level."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="hosts")
    name = models.CharField(max_length=200)
    leaf = models.CharField(max_length=200)
    spine = models.CharField(max_length=200)
    gpus = models.PositiveIntegerField(default=8)
    coords = models.JSONField(null=True, blank=True, help_text="torus: its router's position")
    bandwidth_gbps = models.FloatField(default=0, help_text="sum of its HCA link rates")

    class Meta:
        ordering = ["fabric", "name"]
        constraints = [
            models.UniqueConstraint(fields=["fabric", "name"], name="host_name_unique_per_fabric"),
        ]
        indexes = [models.Index(fields=["fabric", "leaf"]), models.Index(fields=["fabric", "spine"])]

    def __str__(self):
        return self.name


class Hca(models.Model):
    """A host channel adapter: one per rail on a rail-optimised host."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="hcas")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="hcas")
    guid = models.CharField(max_length=40)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        verbose_name = "HCA"
        constraints = [
            models.UniqueConstraint(fields=["fabric", "guid"], name="hca_guid_unique_per_fabric"),
        ]

    def __str__(self):
        return f"{self.host.name} {self.guid}"


class Link(models.Model):
    class State(models.TextChoices):
        ACTIVE = "active"
        DOWN = "down"
        INIT = "init"
        ARMED = "armed"
        POLLING = "polling"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="links")
    rate_gbps = models.DecimalField(max_digits=7, decimal_places=1, null=True, blank=True)
    width = models.CharField(max_length=4, blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.ACTIVE)
    state_changed_at = models.DateTimeField(null=True, blank=True,
                                            help_text="when the fabric agent saw the state change")

    def __str__(self):
        return f"link {self.pk} ({self.rate_gbps} Gb/s)"


class LinkStateChange(models.Model):
    """A link's state as the fabric agent saw it change: the history of a cable (a Flip)."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="link_changes")
    link = models.ForeignKey(Link, on_delete=models.CASCADE, related_name="changes")
    at = models.DateTimeField(help_text="the poll that saw it (the agent's clock)")
    from_state = models.CharField(max_length=10, choices=Link.State.choices)
    to_state = models.CharField(max_length=10, choices=Link.State.choices)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["fabric", "-at"])]

    def __str__(self):
        return f"link {self.link_id}: {self.from_state} -> {self.to_state} at {self.at}"


class Port(models.Model):
    class End(models.TextChoices):
        A = "a"
        B = "b"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="ports")
    switch = models.ForeignKey(Switch, null=True, blank=True, on_delete=models.CASCADE,
                               related_name="port_set")
    hca = models.ForeignKey(Hca, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="port_set")
    number = models.PositiveIntegerField()
    device_guid = models.CharField(max_length=40, help_text="the switch's or HCA's GUID")
    link = models.ForeignKey(Link, null=True, blank=True, on_delete=models.SET_NULL,
                             related_name="ends")
    link_end = models.CharField(max_length=1, choices=End.choices, blank=True)

    class Meta:
        ordering = ["device_guid", "number"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(switch__isnull=False, hca__isnull=True)
                           | Q(switch__isnull=True, hca__isnull=False)),
                name="port_on_one_device",
            ),
            models.UniqueConstraint(fields=["fabric", "device_guid", "number"],
                                    name="port_number_unique_per_device"),
            # a link has one A end and one B end ...
            models.UniqueConstraint(fields=["link", "link_end"], name="link_has_two_ends"),
            # ... on two different devices: no self links
            models.UniqueConstraint(fields=["link", "device_guid"], name="link_joins_two_devices"),
            models.CheckConstraint(
                condition=Q(link__isnull=True, link_end="") | Q(link__isnull=False, link_end__in=["a", "b"]),
                name="linked_port_has_an_end",
            ),
        ]

    def __str__(self):
        return f"{self.device_guid}[{self.number}]"


COUNTER_NAMES = ("xmit_data", "rcv_data", "symbol_errors", "link_downed", "rcv_errors",
                 "xmit_discards")


class PortCounters(models.Model):
    """A port's latest perfquery counters and the sample before them, so that a rate is the
    difference over the time between the two. Data counters count 4-byte words; `extended`
    says they are perfquery -x's 64-bit ones (the basic ones are 32-bit and saturate)."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="port_counters")
    port = models.OneToOneField(Port, on_delete=models.CASCADE, related_name="counters")
    sampled_at = models.DateTimeField(help_text="the poll that read them (the agent's clock)")
    extended = models.BooleanField(default=False)
    xmit_data = models.BigIntegerField()
    rcv_data = models.BigIntegerField()
    symbol_errors = models.BigIntegerField()
    link_downed = models.BigIntegerField()
    rcv_errors = models.BigIntegerField()
    xmit_discards = models.BigIntegerField()
    previous_sampled_at = models.DateTimeField(null=True, blank=True)
    previous_xmit_data = models.BigIntegerField(null=True, blank=True)
    previous_rcv_data = models.BigIntegerField(null=True, blank=True)
    previous_symbol_errors = models.BigIntegerField(null=True, blank=True)
    previous_link_downed = models.BigIntegerField(null=True, blank=True)
    previous_rcv_errors = models.BigIntegerField(null=True, blank=True)
    previous_xmit_discards = models.BigIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "port counters"
        constraints = [
            models.CheckConstraint(
                condition=Q(xmit_data__gte=0, rcv_data__gte=0, symbol_errors__gte=0,
                            link_downed__gte=0, rcv_errors__gte=0, xmit_discards__gte=0),
                name="port_counters_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(previous_sampled_at__isnull=True)
                | Q(previous_sampled_at__lt=models.F("sampled_at")),
                name="port_counters_previous_sample_earlier",
            ),
        ]

    def __str__(self):
        return f"counters of {self.port}"


class Partition(models.Model):
    """A lease's InfiniBand partition on one fabric: its P_Key and the hosts whose HCA ports are
    its full members. `holder` is the market's lease reference (`L-12`): the fabric knows no
    leases (imports go one way). A live partition has no `released_at`; PostgreSQL keeps a P_Key
    in at most one live partition of a fabric, and a lease in at most one per fabric."""

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="partitions")
    pkey = models.PositiveIntegerField(help_text="15 bits, without the full-member bit")
    holder = models.CharField(max_length=64, help_text="the lease reference, e.g. L-12")
    hosts = models.ManyToManyField(Host, related_name="partitions", blank=True)
    rails = models.JSONField(
        default=dict, blank=True,
        help_text="host id → the rails (HCA positions in rail order) its lease's GPUs use there; "
                  "a host not named: all its HCAs")
    bandwidth_class = models.CharField(
        max_length=12, default=qos.STANDARD,
        choices=[(name, name) for name in qos.CLASSES],
        help_text="its lease's class: its P_Key maps to that class's SL (qos-policy.conf)")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["fabric", "pkey"]
        constraints = [
            models.UniqueConstraint(fields=["fabric", "pkey"], condition=Q(released_at__isnull=True),
                                    name="pkey_in_one_live_partition_per_fabric"),
            models.UniqueConstraint(fields=["fabric", "holder"],
                                    condition=Q(released_at__isnull=True),
                                    name="one_live_partition_per_lease_per_fabric"),
            models.CheckConstraint(condition=Q(pkey__gte=PKEY_MIN, pkey__lte=PKEY_MAX),
                                   name="partition_pkey_in_range"),
            models.CheckConstraint(condition=Q(bandwidth_class__in=qos.CLASSES),
                                   name="partition_bandwidth_class_known"),
        ]
        indexes = [models.Index(fields=["holder"])]

    def __str__(self):
        return f"{self.holder}: {self.pkey:#06x}"


class LinkFault(models.Model):
    """A span of time during which a link was faulty: `down` (the fabric agent saw it down, until
    it is active again) or `errors` (its ends counted more errors per minute than the fabric's
    threshold, until an interval at or below it). The scheduler turns the faults on a lease's
    path into SLA events (the fabric knows no leases). An open fault has no `ended_at`."""

    class Kind(models.TextChoices):
        DOWN = "down"
        ERRORS = "errors"

    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="link_faults")
    link = models.ForeignKey(Link, on_delete=models.CASCADE, related_name="faults")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=300, help_text="the link, as people call it: "
                                                      "`leaf01 port 5 - spine01 port 1`")
    detail = models.CharField(max_length=300, blank=True,
                              help_text="e.g. `42.0 errors/min > 10`")
    started_at = models.DateTimeField(help_text="the poll that saw it (the agent's clock)")
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["link", "kind"], condition=Q(ended_at__isnull=True),
                                    name="one_open_fault_per_link_and_kind"),
            models.CheckConstraint(condition=Q(ended_at__isnull=True)
                                   | Q(ended_at__gte=models.F("started_at")),
                                   name="link_fault_ends_after_it_starts"),
        ]
        indexes = [models.Index(fields=["fabric", "ended_at"])]

    def __str__(self):
        return f"{self.name}: {self.kind} from {self.started_at}"


class TrafficAccount(models.Model):
    """What one lease's host sent while the lease was on it: the words its HCA ports counted
    (PortXmitData deltas) over the intervals that started after the lease came onto it, and the
    first and last moments counted. Opened when the pool binds a lease on a host, closed when it
    leaves it; a lease's mean bandwidth is the sum of its accounts over their time. `holder` is
    the market's lease reference (`L-12`): the fabric knows no leases."""

    holder = models.CharField(max_length=64, help_text="the lease reference, e.g. L-12")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="traffic_accounts")
    opened_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    words = models.BigIntegerField(default=0, help_text="4-byte words its HCA ports sent")
    first_at = models.DateTimeField(null=True, blank=True,
                                    help_text="the start of the first interval counted")
    last_at = models.DateTimeField(null=True, blank=True,
                                   help_text="the end of the last interval counted")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["holder", "host"], condition=Q(closed_at__isnull=True),
                                    name="one_open_traffic_account_per_lease_host"),
            models.CheckConstraint(condition=Q(words__gte=0), name="traffic_words_not_negative"),
        ]
        indexes = [models.Index(fields=["holder"]), models.Index(fields=["host", "closed_at"])]

    def __str__(self):
        return f"{self.holder} on host {self.host_id}: {self.words} words"

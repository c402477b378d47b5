"""InfiniBand fabrics, modelled as NetBox models data-centre gear: device → port → link.

A port is on at most one link (the link and its end are unique together, and a port holds one
link), a link never joins a device to itself (its two ends carry different device GUIDs), and
GUIDs are unique per fabric: all enforced by PostgreSQL, not only by the importer.
"""

from django.db import models
from django.db.models import Q

from ibex.accounts.models import Organization


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
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


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

    def __str__(self):
        return f"link {self.pk} ({self.rate_gbps} Gb/s)"


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

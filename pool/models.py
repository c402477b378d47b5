"""The inventory every lease is placed on: GPU models, nodes, GPUs, their health and pools."""

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from fabric.models import Fabric, Host
from ibex.accounts.models import Organization
from ibex.statemachine import StateChange


class GpuModel(models.Model):
    """A GPU part, named by model and memory as everywhere in IBEX (`H100-80GB`)."""

    name = models.CharField(max_length=40, unique=True)
    vendor = models.CharField(max_length=20, default="NVIDIA")
    architecture = models.CharField(max_length=20)
    memory_mib = models.PositiveIntegerField()
    bf16_tflops = models.DecimalField(max_digits=7, decimal_places=1,
                                      help_text="dense BF16 tensor TFLOPS")
    mig_capable = models.BooleanField(default=False)
    mig_profiles = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU model"

    def __str__(self):
        return self.name


class Node(models.Model):
    """A GPU server of a provider, on one host of the provider's fabric."""

    class State(models.TextChoices):
        REGISTERING = "registering"
        ACTIVE = "active"
        DRAINING = "draining"
        OFFLINE = "offline"
        RETIRED = "retired"

    class Health(models.TextChoices):
        REACHABLE = "reachable"
        UNREACHABLE = "unreachable"

    class DrainMode(models.TextChoices):
        MOVE = "move", "move leases off at the next safe point"
        RUN_TO_END = "run_to_end", "let leases run to their end"

    class Runtime(models.TextChoices):
        NONE = "none", "none: serves leases, runs nothing"
        PROCESS = "process", "process: runs the tenant's command"
        SSH = "ssh", "ssh: runs the tenant's command and lets it in by SSH"
        SLURM = "slurm", "slurm: a Slurm gateway reserves it for the lease's slurm_account"

    provider = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="nodes")
    fabric = models.ForeignKey(Fabric, on_delete=models.PROTECT, related_name="nodes")
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="nodes")
    hostname = models.CharField(max_length=200)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="nodes")
    cpu_cores = models.PositiveIntegerField()
    memory_gib = models.PositiveIntegerField()
    os = models.CharField(max_length=100, blank=True)
    driver_version = models.CharField(max_length=50, blank=True)
    state = models.CharField(max_length=12, choices=State.choices, default=State.REGISTERING)
    health = models.CharField(max_length=12, choices=Health.choices, default=Health.REACHABLE)
    drain_mode = models.CharField(max_length=12, choices=DrainMode.choices,
                                  default=DrainMode.RUN_TO_END,
                                  help_text="what happens to its leases while it drains")
    heartbeat_interval_s = models.PositiveIntegerField(default=15)
    # what the node's agent offers, as its heartbeats report it (docs/workloads.md)
    runtime = models.CharField(max_length=8, choices=Runtime.choices, default=Runtime.NONE)
    address = models.CharField(max_length=253, blank=True,
                               help_text="how other nodes and tenants reach it, as its agent says")
    ssh_port = models.PositiveIntegerField(null=True, blank=True)
    inventory_mismatch = models.CharField(
        max_length=300, blank=True,
        help_text="how the GPUs its agent reports differ from its registration; empty when "
                  "they agree")
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    healthy_since = models.DateTimeField(null=True, blank=True,
                                         help_text="start of the current run of healthy heartbeats")
    token_prefix = models.CharField(max_length=16, unique=True)
    token_hash = models.CharField(max_length=64)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["hostname"]
        constraints = [
            models.UniqueConstraint(fields=["host"], condition=~Q(state="retired"),
                                    name="one_live_node_per_host"),
            models.UniqueConstraint(fields=["provider", "hostname"], condition=~Q(state="retired"),
                                    name="one_live_node_per_provider_hostname"),
            models.CheckConstraint(condition=Q(cpu_cores__gt=0) & Q(memory_gib__gt=0),
                                   name="node_has_cpu_and_memory"),
        ]
        indexes = [models.Index(fields=["state", "health", "last_heartbeat_at"])]

    def __str__(self):
        return self.hostname


class NodeStateChange(StateChange):
    """History of a node's state: one row per transition, with who and why."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="state_changes")

    def __str__(self):
        return f"{self.node_id}: {self.from_state} → {self.to_state}"


class Gpu(models.Model):
    class Health(models.TextChoices):
        UNKNOWN = "unknown"  # registered, not (or no longer) reported by the node's agent
        OK = "ok"
        DEGRADED = "degraded"
        FAILED = "failed"
        BUSY = "busy"  # healthy, but running work outside IBEX (a Slurm job): not offered

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=80, blank=True)
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField()
    mig_capable = models.BooleanField(default=False)
    shareable = models.BooleanField(
        default=False, help_text="its provider sells parts of it: MIG slices (on MIG-capable "
                                 "models) and shares, besides the whole GPU")
    nvlink_domain = models.CharField(max_length=80, blank=True)
    health = models.CharField(max_length=10, choices=Health.choices, default=Health.UNKNOWN,
                              help_text="unknown until a heartbeat reports it")
    health_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_per_node"),
            models.UniqueConstraint(fields=["uuid"], condition=~Q(uuid=""),
                                    name="gpu_uuid_unique"),
        ]
        indexes = [models.Index(fields=["health"])]

    def __str__(self):
        return f"{self.node.hostname}/gpu{self.index}"


class HealthEvent(models.Model):
    """Every change of a node's reachability or a GPU's health; the SLA logic reads these."""

    class Kind(models.TextChoices):
        NODE_UNREACHABLE = "node_unreachable"
        NODE_REACHABLE = "node_reachable"
        GPU_HEALTH = "gpu_health"
        INVENTORY = "inventory"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="health_events")
    gpu = models.ForeignKey(Gpu, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="health_events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    from_value = models.CharField(max_length=20)
    to_value = models.CharField(max_length=20)
    detail = models.CharField(max_length=500, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["at", "id"]

    def __str__(self):
        return f"{self.kind}: {self.from_value} → {self.to_value}"


class Binding(models.Model):
    """What a node must serve: the scheduler writes it, the node's heartbeat acknowledges it.

    `lease_ref` is the market's lease id as text: the pool knows no leases (imports go one way).
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="bindings")
    lease_ref = models.CharField(max_length=64)
    gpu_indexes = models.JSONField(default=list)
    parts = models.JSONField(default=list, blank=True,
                             help_text="a lease of parts: [{index, mig_profile, start} | "
                                       "{index, share, memory_mib}] (docs/workloads.md)")
    devices = models.JSONField(default=list, blank=True,
                               help_text="what the agent reports it made of each part: "
                                         "[{..., uuid, enforced, error}]")
    serve = models.BooleanField(default=True, help_text="false: the node must stop serving it")
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # What the node runs for the lease (docs/workloads.md), null when it runs nothing:
    # {command, env, workdir, ssh_keys}. Every change of the lease's nodes or GPUs is a new
    # generation: every rank restarts with the new addresses.
    launch = models.JSONField(null=True, blank=True)
    generation = models.PositiveIntegerField(default=0)
    node_rank = models.PositiveSmallIntegerField(null=True, blank=True)
    nnodes = models.PositiveSmallIntegerField(null=True, blank=True)
    notice_until = models.DateTimeField(null=True, blank=True,
                                        help_text="preempted: SIGTERM now, SIGKILL then")
    # the rank's state, as the node reports it for the current generation
    workload_state = models.CharField(max_length=8, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    master_port = models.PositiveIntegerField(null=True, blank=True)
    workload_error = models.CharField(max_length=500, blank=True)
    log_bytes = models.BigIntegerField(default=0, help_text="its current generation's stored log")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["node", "lease_ref"], name="one_binding_per_node_lease"),
        ]
        indexes = [models.Index(fields=["lease_ref"])]

    def __str__(self):
        return f"{self.lease_ref} on node {self.node_id}"


class WorkloadLog(models.Model):
    """A run of output lines of one rank (a binding's generation), as its agent shipped them.
    A rank keeps its last WORKLOAD_LOG_BYTES; older runs are deleted."""

    binding = models.ForeignKey(Binding, on_delete=models.CASCADE, related_name="logs")
    generation = models.PositiveIntegerField()
    first_line = models.BigIntegerField()
    lines = ArrayField(models.TextField())
    size_bytes = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["binding", "generation", "first_line"])]

    def __str__(self):
        return f"{self.binding} lines {self.first_line}..{self.next_line - 1}"

    @property
    def next_line(self) -> int:
        return self.first_line + len(self.lines)


class Pool(models.Model):
    """A logical pool. The public market pool is every verified provider's GPUs; operators
    define private pools of chosen nodes (used by quotas)."""

    class Kind(models.TextChoices):
        PUBLIC = "public"
        PRIVATE = "private"

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.PRIVATE)
    owner = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="pools")
    nodes = models.ManyToManyField(Node, blank=True, related_name="pools")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return self.name


class QuotaNode(models.Model):
    """A node of a pool's quota tree (`pool.core.quotas.QuotaNode`): a queue (leaf) or a group.

    `cohort` is the core's shorthand for a plain parent shared by the nodes naming it; a node
    names a parent or a cohort, not both. `organization`: whose orders count against it.
    """

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="quota_nodes")
    name = models.SlugField(max_length=100)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="children")
    cohort = models.SlugField(max_length=100, blank=True)
    organization = models.ForeignKey(Organization, null=True, blank=True,
                                     on_delete=models.PROTECT, related_name="quota_nodes")
    preempt_within_queue = models.BooleanField(
        default=False, help_text="a higher-priority order may preempt this queue's own leases")
    shape_nodes = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="guaranteed shape: this many whole nodes inside one leaf, kept placeable")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pool", "name"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="quota_node_name_unique_per_pool"),
            models.CheckConstraint(condition=Q(parent__isnull=True) | Q(cohort=""),
                                   name="quota_node_parent_or_cohort"),
        ]

    def __str__(self):
        return f"{self.pool_id}/{self.name}"

    def clean(self):
        """For forms (the admin): the parent is in the same pool and is not a descendant."""
        if self.parent_id is None:
            return
        if self.cohort:
            raise ValidationError({"cohort": "A quota node names a parent or a cohort, not both."})
        ancestor, seen = self.parent, set()
        while ancestor is not None and ancestor.pk not in seen:
            if ancestor.pool_id != self.pool_id:
                raise ValidationError({"parent": "The parent must be in the same pool."})
            if self.pk is not None and ancestor.pk == self.pk:
                raise ValidationError({"parent": "That parent would make a cycle."})
            seen.add(ancestor.pk)
            ancestor = ancestor.parent


class PriorityClass(models.Model):
    """A named priority of a private pool ("urgent" = 500, "batch" = 0): orders in the pool's
    queues may name it instead of a number; its value becomes the order's priority."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="priority_classes")
    name = models.SlugField(max_length=100)
    value = models.IntegerField(help_text="0–1000: higher is admitted first")
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["pool", "-value", "name"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"],
                                    name="priority_class_name_unique_per_pool"),
            models.CheckConstraint(condition=Q(value__gte=0, value__lte=1000),
                                   name="priority_class_value_range"),
        ]

    def __str__(self):
        return f"{self.pool_id}/{self.name}={self.value}"


class Quota(models.Model):
    """A quota node's GPUs of one model (`pool.core.quotas.ModelQuota`); null limits: no limit."""

    node = models.ForeignKey(QuotaNode, on_delete=models.CASCADE, related_name="quotas")
    gpu_model = models.ForeignKey(GpuModel, on_delete=models.PROTECT, related_name="quotas")
    nominal = models.IntegerField(default=0)
    borrowing_limit = models.IntegerField(null=True, blank=True)
    lending_limit = models.IntegerField(null=True, blank=True)

    class Meta:
        ordering = ["node", "gpu_model"]
        constraints = [
            models.UniqueConstraint(fields=["node", "gpu_model"], name="quota_model_unique_per_node"),
            models.CheckConstraint(
                condition=Q(nominal__gte=0)
                & (Q(borrowing_limit__isnull=True) | Q(borrowing_limit__gte=0))
                & (Q(lending_limit__isnull=True) | Q(lending_limit__gte=0)),
                name="quota_non_negative"),
            models.CheckConstraint(
                condition=Q(lending_limit__isnull=True) | Q(lending_limit__lte=models.F("nominal")),
                name="quota_lending_within_nominal"),
        ]

    def __str__(self):
        return f"{self.node} {self.gpu_model_id}: {self.nominal}"


class TidalStep(models.Model):
    """One step of a pool's tidal schedule: at a daily time (UTC) or at one moment, the named
    quota nodes get new nominal quotas (`{"node": {"GPU model": nominal}}`)."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="tidal_steps")
    name = models.SlugField(max_length=100)
    daily_at = models.TimeField(null=True, blank=True, help_text="every day at this UTC time")
    at = models.DateTimeField(null=True, blank=True, help_text="once, at this moment")
    nominals = models.JSONField(help_text='{"quota node": {"GPU model": nominal}}')
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pool", "name"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "name"], name="tidal_step_name_unique"),
            models.CheckConstraint(condition=Q(daily_at__isnull=True, at__isnull=False)
                                   | Q(daily_at__isnull=False, at__isnull=True),
                                   name="tidal_step_daily_or_once"),
        ]

    def __str__(self):
        return f"{self.pool_id}/{self.name}"


class TidalRun(models.Model):
    """One application of a tidal step: when it started, how many leases had to give way,
    and when the new split was in force (no queue above its new nominal, nothing that fits
    within a nominal left waiting). Unique per (step, due time): two beats apply it once."""

    step = models.ForeignKey(TidalStep, on_delete=models.CASCADE, related_name="runs")
    due_at = models.DateTimeField()
    started_at = models.DateTimeField()
    in_force_at = models.DateTimeField(null=True, blank=True)
    gpus_to_give_way = models.PositiveIntegerField(default=0)
    leases_preempted = models.PositiveIntegerField(default=0)
    lease_ids = models.JSONField(default=list, help_text="the market's ids of the leases "
                                                         "given notice (text: no lease FK)")
    notice_s = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-due_at"]
        constraints = [
            models.UniqueConstraint(fields=["step", "due_at"], name="tidal_run_once_per_due_time"),
        ]

    def __str__(self):
        return f"{self.step} @ {self.due_at:%Y-%m-%d %H:%M}"

    @property
    def seconds_to_force(self) -> float | None:
        if self.in_force_at is None:
            return None
        return (self.in_force_at - self.started_at).total_seconds()

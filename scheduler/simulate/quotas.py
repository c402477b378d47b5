"""Replaying a trace under quotas: tenants (Philly's virtual clusters) as quota holders.

    python -m scheduler.simulate --cluster C.csv --workload J.csv --policy best_fit \
        --mode replay --quotas QUOTAS.csv [--no-borrowing] --out RESULT.json
    python -m scheduler.simulate make-quotas --workload J.csv --gpus 2048 \
        --gpu-model V100-32GB --out QUOTAS.csv

QUOTAS.csv has exactly the columns `tenant,gpu_model,nominal,borrowing_limit,lending_limit,
priority` (empty limits: none). Every tenant is a queue of one cohort (`pool.core.quotas`): at each
instant the pure admission (`pool.core.quotas.admit`: priority, FIFO within a priority, queues
within their nominal first, borrowers by dominant share) decides which waiting jobs may
start, and the placement policy places them on the cluster; an admitted job that does not
fit yet waits for the next instant. Nothing is preempted (the trace's jobs run to the end).
`--no-borrowing` sets every borrowing limit to 0: each tenant is held to its nominal.
At each instant each tenant offers its first waiting jobs that fit its quota and the free
GPUs at that moment (the others could not start in that pass anyway), at most
`ADMISSION_WINDOW` of them and no more GPUs in all than are free, which bounds the work per
event.
"""

from __future__ import annotations

import csv
import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from pool.core import quotas as core
from scheduler.simulate.cluster import Cluster
from scheduler.simulate.csvread import read_rows
from scheduler.simulate.errors import InputError
from scheduler.simulate.metrics import mean, percentile
from scheduler.simulate.policies import Policy
from scheduler.simulate.state import Allocation, ClusterState, fits_empty_cluster
from scheduler.simulate.workload import Job

QUOTA_COLUMNS = ("tenant", "gpu_model", "nominal", "borrowing_limit", "lending_limit",
                 "priority")
COHORT = "cluster"
ADMISSION_WINDOW = 64


@dataclass(frozen=True)
class TenantQuota:
    tenant: str
    gpu_model: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    priority: int


def load_quotas(path: str) -> list[TenantQuota]:
    """The quota rows; bad input names the file and the line."""
    out: list[TenantQuota] = []
    seen: dict[tuple[str, str], int] = {}
    priorities: dict[str, int] = {}
    for row in read_rows(path, QUOTA_COLUMNS):
        extra = [c for c in row.cells if c not in QUOTA_COLUMNS]
        if extra:
            raise InputError(path, 1, f"unknown column {extra[0]} (the columns are exactly "
                                      f"{','.join(QUOTA_COLUMNS)})")
        tenant, model = row.text("tenant"), row.text("gpu_model")
        if not tenant:
            raise row.error("tenant is empty")
        if not model:
            raise row.error("gpu_model is empty")
        if (tenant, model) in seen:
            raise row.error(f"{tenant} {model} is already on line {seen[tenant, model]}")
        seen[tenant, model] = row.line
        nominal = row.count("nominal")
        borrowing = None if not row.text("borrowing_limit") else row.count("borrowing_limit")
        lending = None if not row.text("lending_limit") else row.count("lending_limit")
        if lending is not None and lending > nominal:
            raise row.error(f"lending_limit {lending} is above nominal {nominal}")
        priority = row.count("priority", default=0)
        if priorities.setdefault(tenant, priority) != priority:
            raise row.error(f"{tenant} has another priority on an earlier line")
        out.append(TenantQuota(tenant, model, nominal, borrowing, lending, priority))
    if not out:
        raise InputError(path, None, "no quotas")
    return out


def quota_tree(quotas: Sequence[TenantQuota], borrowing: bool = True) -> core.QuotaTree:
    by_tenant: dict[str, dict[str, core.ModelQuota]] = defaultdict(dict)
    for q in quotas:
        by_tenant[q.tenant][q.gpu_model] = core.ModelQuota(
            q.nominal, q.borrowing_limit if borrowing else 0, q.lending_limit)
    return core.QuotaTree(core.QuotaNode(tenant, cohort=COHORT, quotas=models)
                          for tenant, models in by_tenant.items())


def make_quotas(jobs: Sequence[Job], gpus: int, gpu_model: str,
                floor: int = 8) -> list[TenantQuota]:
    """Nominals: `floor` GPUs each (when the GPUs allow), the rest in proportion to each
    tenant's GPU-time in the workload (largest remainder); no limits, priority 0: a starting
    point to edit."""
    use: dict[str, float] = defaultdict(float)
    for job in jobs:
        use[job.tenant or "default"] += job.gpu_demand * job.duration_s
    total = sum(use.values()) or 1.0
    floor = floor if floor * len(use) <= gpus else 0
    rest = gpus - floor * len(use)
    exact = {t: floor + rest * u / total for t, u in use.items()}
    nominal = {t: int(v) for t, v in exact.items()}
    for tenant in sorted(exact, key=lambda t: (nominal[t] - exact[t], t))[:gpus - sum(
            nominal.values())]:
        nominal[tenant] += 1
    return [TenantQuota(t, gpu_model, nominal[t], None, None, 0) for t in sorted(nominal)]


def write_quotas(path: str, quotas: Sequence[TenantQuota]) -> None:
    try:
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(QUOTA_COLUMNS)
            for q in quotas:
                writer.writerow([q.tenant, q.gpu_model, q.nominal,
                                 "" if q.borrowing_limit is None else q.borrowing_limit,
                                 "" if q.lending_limit is None else q.lending_limit,
                                 q.priority])
    except OSError as error:
        raise InputError(path, None, f"cannot write: {error.strerror}") from None


class QuotaReplay:
    """Arrivals and completions; at each instant, admission under quotas, then placement."""

    def __init__(self, cluster: Cluster, jobs: Sequence[Job], policy: Policy,
                 quotas: Sequence[TenantQuota], quotas_path: str, borrowing: bool = True,
                 locality: str = "pod") -> None:
        self.cluster = cluster
        self.jobs = sorted(jobs, key=lambda job: (job.submit_s, job.position))
        self.policy = policy
        self.tree = quota_tree(quotas, borrowing)
        self.borrowing = borrowing
        self.state = ClusterState(cluster, locality)
        models: dict[str, list[str]] = defaultdict(list)
        self.priority: dict[str, int] = {}
        for q in quotas:
            models[q.tenant].append(q.gpu_model)
            self.priority[q.tenant] = q.priority
        self.model_of: dict[int, str] = {}
        for job in self.jobs:
            tenant = job.tenant or "default"
            if tenant not in models:
                raise InputError(quotas_path, None, f"tenant {tenant!r} of the workload has "
                                                    "no quota row")
            chosen = sorted(job.gpu_models & set(models[tenant])) if job.gpu_models else \
                sorted(models[tenant])
            if not chosen:
                raise InputError(quotas_path, None, f"tenant {tenant!r} has no quota for the "
                                                    f"models job {job.name} accepts")
            self.model_of[job.position] = chosen[0]
        self.waiting: dict[str, list[Job]] = defaultdict(list)
        self.usage: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.running: list[tuple[float, int, Job, Allocation]] = []
        self.waits: dict[str, list[float]] = defaultdict(list)
        self.refused: list[Job] = []
        self.refused_of: dict[str, int] = defaultdict(int)
        self.borrowed_gpu_s: dict[str, float] = defaultdict(float)
        self.done = 0
        self._seq = 0

    def run(self) -> QuotaReplay:
        arrivals = iter(self.jobs)
        upcoming = next(arrivals, None)
        while upcoming is not None or self.running:
            now = min(upcoming.submit_s if upcoming else float("inf"),
                      self.running[0][0] if self.running else float("inf"))
            while self.running and self.running[0][0] <= now:
                _, _, job, allocation = heapq.heappop(self.running)
                self.state.give_back(allocation)
                self.usage[job.tenant or "default"][self.model_of[job.position]] -= job.gpus
                self.done += 1
            while upcoming is not None and upcoming.submit_s <= now:
                if fits_empty_cluster(self.cluster, upcoming) and upcoming.gpus <= \
                        self._most_ever(upcoming):
                    self.waiting[upcoming.tenant or "default"].append(upcoming)
                else:
                    self.refused.append(upcoming)
                    self.refused_of[upcoming.tenant or "default"] += 1
                upcoming = next(arrivals, None)
            self.admit(now)
        return self

    def _most_ever(self, job: Job) -> int:
        return core.available_to(self.tree, job.tenant or "default",
                                 self.model_of[job.position], {})

    def admit(self, now: float) -> None:
        """Offer each tenant's first waiting jobs that fit its quota now (one that does not fit
        at the start of a pass cannot fit later in it: usage only grows), up to
        `ADMISSION_WINDOW` per tenant; nothing when no GPU is free."""
        free = self.state.free_whole()
        if free == 0:
            return
        offered = {}
        for tenant, jobs in self.waiting.items():
            if not jobs:
                continue
            room: dict[str, int] = {}
            taken = gpus = 0
            for job in jobs:
                model = self.model_of[job.position]
                if model not in room:
                    room[model] = core.available_to(self.tree, tenant, model, self.usage)
                if job.gpus <= min(room[model], free):
                    offered[str(job.position)] = job
                    taken += 1
                    gpus += job.gpus
                    if taken == ADMISSION_WINDOW or gpus >= free:
                        break
        if not offered:
            return
        workloads = [core.Workload(id=key, queue=job.tenant or "default",
                                   model=self.model_of[job.position], gpus=job.gpus,
                                   priority=self.priority[job.tenant or "default"],
                                   submitted_at=job.submit_s)
                     for key, job in offered.items()]
        admission = core.admit(self.tree, self.usage, workloads)
        started = set()
        for workload, borrowed in admission.admitted:
            job = offered[workload.id]
            allocation = self.policy.place(self.state, job) if job.gpus else None
            if job.gpus and allocation is None:
                continue  # admitted, but no room on the cluster yet
            if allocation is not None:
                allocation = self.state.take(allocation)
            self._seq += 1
            heapq.heappush(self.running, (now + job.duration_s, self._seq, job, allocation))
            self.usage[workload.queue][workload.model] += job.gpus
            self.waits[workload.queue].append(now - job.submit_s)
            self.borrowed_gpu_s[workload.queue] += borrowed * job.duration_s
            started.add(job.position)
        if started:
            for tenant in list(self.waiting):
                self.waiting[tenant] = [j for j in self.waiting[tenant]
                                        if j.position not in started]

    def results(self) -> dict:
        tenants = {}
        for tenant in sorted(self.priority):
            waits = self.waits.get(tenant, [])
            tenants[tenant] = {
                "nominal": {m: self.tree.nominal(tenant, m) for m in self.tree.models()
                            if self.tree.nominal(tenant, m)},
                "jobs": len(waits),
                "refused": self.refused_of.get(tenant, 0),
                "wait_s": {"mean": mean(waits), "p50": percentile(waits, 0.5),
                           "p95": percentile(waits, 0.95)},
                "borrowed_gpu_s": self.borrowed_gpu_s.get(tenant, 0.0),
            }
        every = [w for waits in self.waits.values() for w in waits]
        return {
            "borrowing": self.borrowing,
            "jobs": {"total": len(self.jobs), "completed": self.done,
                     "refused": len(self.refused)},
            "wait_s": {"mean": mean(every), "p50": percentile(every, 0.5),
                       "p95": percentile(every, 0.95)},
            "tenants": tenants,
        }

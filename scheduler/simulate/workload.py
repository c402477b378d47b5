"""The workload CSV: job,submit_s,duration_s,gpus,gpu_milli,gpu_model,cpu_milli,memory_mib,tenant.

`gpus` whole GPUs, or `gpus=1` with `gpu_milli` below 1000 for a share of one GPU, or `gpus=0`
for a job that needs no GPU. `gpu_model` is empty for any model, or alternatives joined by `|`.
`cpu_milli` and `memory_mib` are the job's totals (empty: none); a job spread over several
nodes takes them in proportion to the GPUs it holds on each.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from scheduler.simulate.csvread import read_rows
from scheduler.simulate.errors import InputError

WORKLOAD_COLUMNS = ("job", "submit_s", "duration_s", "gpus", "gpu_milli", "gpu_model",
                    "cpu_milli", "memory_mib", "tenant")
WHOLE = 1000  # gpu_milli of a whole GPU


@dataclass(frozen=True)
class Job:
    name: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_milli: int = WHOLE  # per GPU: 1000 whole, 1..999 a share of one GPU, 0 with gpus=0
    gpu_models: frozenset[str] | None = None  # None: any model
    cpu_milli: int = 0
    memory_mib: int = 0
    tenant: str = ""
    position: int = 0  # order in the file; ties in submit_s keep it

    @property
    def is_shared(self) -> bool:
        return self.gpus == 1 and self.gpu_milli < WHOLE

    @property
    def gpu_demand(self) -> float:
        """GPUs asked for, a share counting in thousandths."""
        return self.gpu_milli / WHOLE if self.is_shared else float(self.gpus)

    @property
    def whole_gpus(self) -> int:
        """Whole GPUs the job takes from the pool (a share takes none of them whole)."""
        return 0 if self.is_shared else self.gpus


def parse_models(text: str) -> frozenset[str] | None:
    models = frozenset(part.strip() for part in text.split("|") if part.strip())
    return models or None


def load_workload(path: str) -> list[Job]:
    """Jobs sorted by submit time (file order breaks ties)."""
    jobs: list[Job] = []
    for row in read_rows(path, WORKLOAD_COLUMNS):
        name = row.text("job") or f"line{row.line}"
        duration = row.number("duration_s")
        if duration < 0:
            raise row.error("duration_s must not be negative")
        gpus = row.count("gpus")
        milli = row.count("gpu_milli", default=WHOLE if gpus else 0)
        if gpus == 0 and milli:
            raise row.error("gpu_milli needs gpus of at least 1")
        if gpus and not 1 <= milli <= WHOLE:
            raise row.error("gpu_milli must be between 1 and 1000")
        if gpus > 1 and milli < WHOLE:
            raise row.error("gpu_milli below 1000 needs gpus=1")
        jobs.append(Job(
            name=name,
            submit_s=row.number("submit_s"),
            duration_s=duration,
            gpus=gpus,
            gpu_milli=milli,
            gpu_models=parse_models(row.text("gpu_model")),
            cpu_milli=row.count("cpu_milli", default=0),
            memory_mib=row.count("memory_mib", default=0),
            tenant=row.text("tenant"),
            position=len(jobs),
        ))
    if not jobs:
        raise InputError(path, None, "no jobs")
    jobs.sort(key=lambda job: (job.submit_s, job.position))
    return jobs


def write_workload(path: str, jobs: list[Job]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(WORKLOAD_COLUMNS)
        for job in jobs:
            models = "|".join(sorted(job.gpu_models)) if job.gpu_models else ""
            writer.writerow([
                job.name, _plain(job.submit_s), _plain(job.duration_s), job.gpus,
                job.gpu_milli if job.is_shared else "", models, job.cpu_milli or "",
                job.memory_mib or "", job.tenant,
            ])


def _plain(number: float) -> str:
    return str(int(number)) if number == int(number) else repr(number)

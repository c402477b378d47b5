"""`convert`: a job-level GPU trace (Philly's columns) to the workload CSV.

Input columns: `timestamp` (an ISO date-time, or seconds), `duration` (seconds), `num_gpus`,
and optionally `cluster` (the tenant: Philly's virtual cluster); others (`gpu_time`) are
ignored. Submit times are made relative to the earliest job. Jobs carry no CPU, memory or GPU
model demand, which the trace does not record.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from scheduler.simulate.csvread import Row, read_rows
from scheduler.simulate.errors import InputError
from scheduler.simulate.workload import Job, write_workload

TRACE_COLUMNS = ("timestamp", "duration", "num_gpus")


def timestamp_seconds(row: Row) -> float:
    text = row.text("timestamp")
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise row.error("timestamp is neither a date-time nor a number") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # Philly's times carry no zone
    return moment.timestamp()


def read_trace(path: str) -> list[Job]:
    rows: list[tuple[float, Job]] = []
    for row in read_rows(path, TRACE_COLUMNS):
        duration = row.number("duration")
        if duration < 0:
            raise row.error("duration must not be negative")
        gpus = row.count("num_gpus")
        job = Job(name=f"job{row.line - 1:06d}", submit_s=0.0, duration_s=duration, gpus=gpus,
                  gpu_milli=1000 if gpus else 0, tenant=row.text("cluster"),
                  position=len(rows))
        rows.append((timestamp_seconds(row), job))
    if not rows:
        raise InputError(path, None, "no jobs")
    start = min(seconds for seconds, _ in rows)
    jobs = [replace(job, submit_s=seconds - start) for seconds, job in rows]
    jobs.sort(key=lambda job: (job.submit_s, job.position))
    return jobs


def convert_trace(source: str, target: str) -> int:
    jobs = read_trace(source)
    write_workload(target, jobs)
    return len(jobs)

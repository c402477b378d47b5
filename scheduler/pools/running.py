"""The leases running in a private pool as the pure quota core sees them; admission and the
tidal schedules both measure a pool's usage from these."""

from __future__ import annotations

from datetime import datetime

from pool.core import quotas as core


def epoch(moment: datetime) -> float:
    return moment.timestamp()


def running_of(leases) -> list[core.RunningLease]:
    return [core.RunningLease(id=str(lease.pk), queue=lease.quota_node.name,
                              model=lease.gpu_model, gpus=lease.gpu_count,
                              priority=lease.priority,
                              started_at=epoch(lease.created_at)) for lease in leases]

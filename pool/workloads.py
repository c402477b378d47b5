"""What nodes run for leases (docs/workloads.md): the launch a start action carries, the ranks'
states as heartbeats report them, notices, the logs agents ship, and heartbeats answered early
when work arrives for a node.

The pool knows no leases: a lease is its `lease_ref`, and what it runs is the `launch` its
bindings were given by the scheduler.
"""

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from fabric import selectors as fabric_selectors
from pool.core import workloads as core
from pool.models import Binding, Node, WorkloadLog

log = logging.getLogger(__name__)

STOP_GRACE_S = 30


# --- heartbeats answered early ------------------------------------------------------------------
#
# An agent may hold its heartbeat open for `wait_s` seconds (a long poll). A change a node must
# hear about (a binding, rank 0's port, a notice) pushes a token on the node's Redis list after
# commit; the held heartbeat pops it and answers at once. A token pushed while nobody waits
# only makes the next heartbeat come back at once, once.

WAKE_KEY = "ibex:node-wake:{node_id}"
_redis_local = threading.local()
# a web worker's threads are shared by every request: held heartbeats may take only some
_waiters = threading.BoundedSemaphore(settings.HEARTBEAT_MAX_WAITERS)


def _redis() -> redis.Redis:
    client = getattr(_redis_local, "client", None)
    if client is None:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2,
                                      socket_timeout=settings.HEARTBEAT_MAX_WAIT_S + 5)
        _redis_local.client = client
    return client


def wake_nodes(node_ids) -> None:
    """After the current transaction commits, answer the nodes' held heartbeats now."""
    node_ids = sorted(set(node_ids))
    if node_ids:
        transaction.on_commit(lambda: _push_wake(node_ids), robust=True)


def _push_wake(node_ids: list[int]) -> None:
    try:
        pipe = _redis().pipeline()
        for node_id in node_ids:
            key = WAKE_KEY.format(node_id=node_id)
            pipe.rpush(key, 1)
            pipe.expire(key, 60)
        pipe.execute()
    except redis.RedisError as exc:  # the node hears at its next heartbeat instead
        log.warning("could not wake nodes %s: %s", node_ids, exc)


def forget_wakes(node_id: int) -> None:
    """A heartbeat is being answered: tokens pushed before now are answered by it."""
    try:
        _redis().delete(WAKE_KEY.format(node_id=node_id))
    except redis.RedisError:
        pass


def wait_for_work(node_id: int, wait_s: float) -> bool:
    """Hold a heartbeat until the node is woken or `wait_s` passes; True when woken. Answers at
    once when Redis is down or every waiting place of this worker is taken."""
    wait_s = min(wait_s, settings.HEARTBEAT_MAX_WAIT_S)
    if wait_s < 0.1 or not _waiters.acquire(blocking=False):
        return False
    try:
        # (a fractional timeout needs Redis 6; the embedded one is 6.2)
        return _redis().blpop([WAKE_KEY.format(node_id=node_id)], timeout=wait_s) is not None
    except redis.RedisError:
        return False
    finally:
        _waiters.release()


# --- what a heartbeat's answer asks of the node's ranks --------------------------------------------


def start_action(binding: Binding) -> dict | None:
    """The start action for a binding; None while it must wait (a rank other than 0 starts once
    rank 0's agent has reported its port)."""
    action = {"action": "start", "lease": binding.lease_ref, "gpus": binding.gpu_indexes}
    if binding.parts:
        action["parts"] = binding.parts
    if binding.launch is None:
        return action
    ranks = list(Binding.objects.filter(lease_ref=binding.lease_ref, serve=True,
                                        generation=binding.generation)
                 .select_related("node").order_by("node_rank"))
    rank_zero = ranks[0] if ranks else binding
    master_port = None if binding.node_rank == 0 else rank_zero.master_port
    if binding.node_rank != 0 and binding.launch.get("command") and master_port is None:
        return None
    action["launch"] = core.launch_for_rank(
        binding.launch, lease_ref=binding.lease_ref, generation=binding.generation, node_rank=binding.node_rank or 0,
        nnodes=binding.nnodes or len(ranks), master_port=master_port,
        node_addrs=[b.node.address or b.node.hostname for b in ranks],
        ib_pkey=fabric_selectors.pkeys_of([binding.lease_ref]).get(binding.lease_ref))
    return action


def stop_action(binding: Binding | None, lease_ref: str, now: datetime) -> dict:
    """Stop serving: SIGTERM, then SIGKILL after the grace (none left after a notice)."""
    grace = STOP_GRACE_S
    if binding is not None and binding.notice_until is not None:
        grace = max(0, int((binding.notice_until - now).total_seconds()))
    return {"action": "stop", "lease": lease_ref,
            "gpus": binding.gpu_indexes if binding else [], "grace_s": grace}


def notice_action(binding: Binding) -> dict:
    return {"action": "notice", "lease": binding.lease_ref, "gpus": binding.gpu_indexes,
            "until": binding.notice_until.isoformat()}


def record_reports(bindings: list[Binding], reports: dict[str, dict]) -> list[int]:
    """Write what the node reports of each binding's current generation (a report of an older
    generation is the agent catching up: ignored). Returns the nodes to wake: the other ranks
    of a lease whose rank 0 has just reported its port."""
    wake: list[int] = []
    for binding in bindings:
        report = reports.get(binding.lease_ref)
        if report is None or report["generation"] != binding.generation or not binding.launch:
            continue
        changes = _changes(binding, report)
        if not changes:
            continue
        Binding.objects.filter(pk=binding.pk, generation=binding.generation).update(**changes)
        for name, value in changes.items():
            setattr(binding, name, value)
        if "master_port" in changes and binding.node_rank == 0:
            wake += list(Binding.objects.filter(
                lease_ref=binding.lease_ref, serve=True, generation=binding.generation)
                .exclude(pk=binding.pk).values_list("node_id", flat=True))
    return wake


def record_devices(bindings: list[Binding], devices: dict[str, list[dict]]) -> None:
    """Write what the node reports it made of each part it serves (MIG devices, MPS limits),
    where that changed."""
    for binding in bindings:
        made = devices.get(binding.lease_ref)
        if made is not None and binding.parts and made != binding.devices:
            Binding.objects.filter(pk=binding.pk).update(devices=made)
            binding.devices = made


def _changes(binding: Binding, report: dict) -> dict:
    wanted = {
        "workload_state": report["state"],
        "exit_code": report.get("exit_code"),
        "started_at": report.get("started_at"),
        "ended_at": report.get("ended_at"),
        "workload_error": (report.get("error") or "")[:500],
    }
    if binding.node_rank == 0 and report.get("master_port") and binding.master_port is None:
        wanted["master_port"] = report["master_port"]
    return {name: value for name, value in wanted.items() if getattr(binding, name) != value}


# --- notices (called by the market) ------------------------------------------------------------


@transaction.atomic
def give_notice(*, lease_ref: str, until: datetime) -> None:
    """The lease is preempted: its ranks get SIGTERM now and SIGKILL at `until`."""
    nodes = list(Binding.objects.filter(lease_ref=lease_ref, serve=True)
                 .values_list("node_id", flat=True))
    Binding.objects.filter(lease_ref=lease_ref, serve=True).update(notice_until=until)
    wake_nodes(nodes)


# --- the tenant's view -----------------------------------------------------------------------------


def bindings_by_lease(lease_refs) -> dict[str, list[Binding]]:
    """Every binding of these leases, with its node, in one query (for a page of leases)."""
    found: dict[str, list[Binding]] = {ref: [] for ref in lease_refs}
    for binding in Binding.objects.filter(lease_ref__in=list(found)).select_related("node"):
        found[binding.lease_ref].append(binding)
    return found


def current_ranks(bindings: list[Binding]) -> list[Binding]:
    """Of one lease's bindings, those of its latest generation (its ranks), in rank order: the
    nodes it left behind in a move are not among them."""
    launched = [b for b in bindings if b.launch is not None]
    if not launched:
        return []
    latest = max(b.generation for b in launched)
    return sorted((b for b in launched if b.generation == latest), key=lambda b: b.node_rank or 0)


def workload_view(bindings: list[Binding], work: dict | None) -> dict | None:
    """The lease JSON's `workload`: None when the lease runs no command."""
    if not work or not work.get("command"):
        return None
    ranks = current_ranks(bindings)
    return {
        "command": work["command"],
        "env": work.get("env") or {},
        "workdir": work.get("workdir") or "",
        "state": core.workload_state([b.workload_state for b in ranks]),
        "nodes": [{"node": b.node.hostname, "node_rank": b.node_rank,
                   "state": b.workload_state or "waiting", "exit_code": b.exit_code,
                   "started_at": b.started_at, "ended_at": b.ended_at,
                   "error": b.workload_error} for b in ranks],
    }


def access_view(bindings: list[Binding], lease_ref: str, ssh_wanted: bool,
                slurm_account: str = "") -> list[dict]:
    """The lease JSON's `access`: per node it is bound to, a ready SSH line, or None where the
    node offers no SSH (or the lease brought no keys); and on a Slurm node, the `srun` that
    runs a job in the lease's reservation (None elsewhere)."""
    access = []
    for b in sorted((b for b in bindings if b.serve), key=lambda b: b.node.hostname):
        node = b.node
        offers = ssh_wanted and node.runtime == Node.Runtime.SSH and node.ssh_port
        on_slurm = slurm_account and node.runtime == Node.Runtime.SLURM
        access.append({
            "node": node.hostname,
            "ssh": core.ssh_line(core.lease_account(lease_ref), node.address or node.hostname,
                                 node.ssh_port) if offers else None,
            "slurm": core.srun_line(lease_ref, slurm_account) if on_slurm else None,
        })
    return access


def parts_view(held: list[tuple[str, int, str, int, int]], bindings: list[Binding]) -> list[dict]:
    """The lease JSON's `gpus` for a lease of parts: per part (hostname, GPU index, MIG
    profile or "", span [lower, upper)) its node, GPU and profile or share, with what the
    node's agent reported making of it (`device`, `enforced`, `error`; null until reported)."""
    reported: dict[tuple[str, int], list[dict]] = {}
    for b in bindings:
        if b.serve:
            for device in b.devices or []:
                reported.setdefault((b.node.hostname, device.get("index")), []).append(device)
    view = []
    for host, index, mig_profile, lower, upper in held:
        item: dict = {"node": host, "index": index}
        if mig_profile:
            item["mig_profile"] = mig_profile
            start = lower * 8 // 1000
            match = [d for d in reported.get((host, index), []) if d.get("start") == start]
        else:
            item["share"] = upper - lower
            match = [d for d in reported.get((host, index), [])
                     if d.get("share") == upper - lower]
        device = match[0] if match else {}
        item.update(device=device.get("uuid"), enforced=device.get("enforced"),
                    error=device.get("error") or "")
        view.append(item)
    return view


# --- logs ------------------------------------------------------------------------------------------

LINE_MAX_BYTES = 64 * 1024
REQUEST_MAX_BYTES = 2 * 1024 * 1024


class LogRefused(Exception):
    """A log shipment for a lease the node does not run (the API answers 404)."""


@transaction.atomic
def append_log(*, node: Node, lease_ref: str, generation: int, from_line: int,
               lines: list[str]) -> int:
    """Store the lines the agent shipped from `from_line` on; lines already stored are skipped,
    a gap is lines the agent lost (the reader is told they were dropped). The rank keeps its
    last WORKLOAD_LOG_BYTES. Returns the line expected next."""
    binding = (Binding.objects.select_for_update()
               .filter(node=node, lease_ref=lease_ref, launch__isnull=False).first())
    if binding is None or binding.generation != generation:
        raise LogRefused(f"node {node.hostname} runs no generation {generation} of lease "
                         f"{lease_ref}")
    last = (WorkloadLog.objects.filter(binding=binding, generation=generation)
            .order_by("-first_line").first())
    expected = last.next_line if last else 0
    skip = max(0, expected - from_line)
    fresh = lines[skip:]
    if not fresh:
        return max(expected, from_line)
    size = sum(len(line.encode()) for line in fresh)
    WorkloadLog.objects.create(binding=binding, generation=generation,
                               first_line=from_line + skip, lines=fresh, size_bytes=size)
    binding.log_bytes += size
    if binding.log_bytes > settings.WORKLOAD_LOG_BYTES:
        binding.log_bytes -= _trim(binding, generation)
    Binding.objects.filter(pk=binding.pk).update(log_bytes=binding.log_bytes)
    return from_line + len(lines)


def _trim(binding: Binding, generation: int) -> int:
    """Delete the oldest runs of lines past the rank's budget; returns the bytes deleted."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH newest_first AS (
                SELECT id, SUM(size_bytes) OVER (ORDER BY first_line DESC) AS kept
                FROM pool_workloadlog WHERE binding_id = %s AND generation = %s)
            DELETE FROM pool_workloadlog WHERE id IN (
                SELECT id FROM newest_first WHERE kept > %s)
            RETURNING size_bytes
            """, [binding.pk, generation, settings.WORKLOAD_LOG_BYTES])
        return sum(size for (size,) in cursor.fetchall())


def delete_old_logs(*, now: datetime | None = None) -> int:
    """Delete the output of ranks whose node stopped serving their lease more than
    WORKLOAD_LOG_RETENTION_DAYS ago (the hourly beat); returns the runs of lines deleted."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.WORKLOAD_LOG_RETENTION_DAYS)
    deleted, _ = WorkloadLog.objects.filter(binding__stopped_at__lt=cutoff).delete()
    return deleted


@dataclass(frozen=True)
class LogPage:
    node_rank: int
    node: str | None  # None until the lease is on its nodes
    lines: list[str]
    cursor: str
    dropped: int
    more: bool


class NoSuchRank(Exception):
    pass


def read_log(*, lease_ref: str, node_rank: int, since: str | None,
             limit_bytes: int = 1024 * 1024) -> LogPage:
    """A page of a rank's output after the cursor `since` (from the start without one). A lease
    not on its nodes yet, or running no command, has no output yet: an empty page."""
    ranks = current_ranks(bindings_by_lease([lease_ref])[lease_ref])
    generation, line = _parse_cursor(since)
    if not ranks:
        return LogPage(node_rank=node_rank, node=None, lines=[], cursor=since or "0.0",
                       dropped=0, more=False)
    rank = next((b for b in ranks if b.node_rank == node_rank), None)
    if rank is None:
        raise NoSuchRank(f"the lease has no node_rank {node_rank}: its ranks are "
                         f"0..{len(ranks) - 1}")
    if generation != rank.generation:  # the lease moved and restarted: its new run, from the top
        line = 0
    runs = WorkloadLog.objects.filter(binding=rank, generation=rank.generation)
    lines: list[str] = []
    dropped, size, more, position = 0, 0, False, line
    for run in runs.filter(first_line__gte=_run_start(runs, line)).order_by(
            "first_line").iterator(chunk_size=20):
        if run.first_line > position:  # trimmed, or lost by the agent
            dropped += run.first_line - position
            position = run.first_line
        for text in run.lines[position - run.first_line:]:
            if size + len(text) > limit_bytes and lines:
                more = True
                break
            lines.append(text)
            size += len(text)
            position += 1
        if more:
            break
    return LogPage(node_rank=node_rank, node=rank.node.hostname, lines=lines,
                   cursor=f"{rank.generation}.{position}", dropped=dropped, more=more)


def _run_start(runs, line: int) -> int:
    """The first line of the run holding `line` (or of the first run after it)."""
    holding = (runs.filter(first_line__lte=line).order_by("-first_line")
               .values_list("first_line", flat=True).first())
    return holding if holding is not None else line


class BadCursor(ValueError):
    pass


def _parse_cursor(since: str | None) -> tuple[int | None, int]:
    if not since:
        return None, 0
    generation, _, line = since.partition(".")
    if not generation.isdigit() or not line.isdigit():
        raise BadCursor("since must be a cursor returned by a previous page")
    return int(generation), int(line)


def parse_report_time(value) -> datetime | None:
    if value is None:
        return None
    moment = parse_datetime(value) if isinstance(value, str) else None
    if moment is None or moment.tzinfo is None:
        raise ValueError("expected an ISO 8601 time with a zone")
    return moment


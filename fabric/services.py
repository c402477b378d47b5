"""Every change to fabrics goes through here: import (files or generators), deletion, and the
fabric agent's reports of the live fabric.

An import is one transaction: the file is parsed and checked in full before anything is
written, and re-importing a fabric updates its switches and hosts in place (by GUID and by
host name), so nodes registered on its hosts keep pointing at them.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db import IntegrityError, OperationalError, connection, transaction
from django.db.models import Count
from django.utils import timezone

from fabric.core import bandwidth
from fabric.core import partitions as partitions_core
from fabric.core import qos as qos_core
from fabric.core.diags import link_key
from fabric.core.errors import FabricFormatError
from fabric.core.ibnetdiscover import parse_ibnetdiscover
from fabric.core.levels import analyse, summarise
from fabric.core.slurm import parse_slurm_topology
from fabric.core.spec import FabricSpec
from fabric.core.topology import bandwidth_inputs
from fabric.models import (
    COUNTER_NAMES,
    ERROR_THRESHOLD_MAX,
    Fabric,
    FabricRoutes,
    Hca,
    Host,
    Link,
    LinkFault,
    LinkStateChange,
    Partition,
    Port,
    PortCounters,
    Switch,
    TrafficAccount,
)
from fabric.selectors import live_partitions, qos_answer
from ibex.accounts.models import Organization
from ibex.db import analyze_after_bulk_load
from ibex.errors import Refusal

FORMATS = ("ibnetdiscover", "slurm")
BATCH = 5000
MAX_HOSTS_PER_FABRIC = 200_000


class FabricImportError(Refusal):
    """A fabric that cannot be imported; the message is meant for the person importing it,
    and the fault is in the file."""

    field = "file"


@dataclass(frozen=True)
class ImportResult:
    fabric: Fabric
    created: bool
    summary: dict


def parse_fabric_file(text: str, *, fmt: str, path: str, gpus_per_node: int = 8) -> FabricSpec:
    if fmt == "ibnetdiscover":
        return parse_ibnetdiscover(text, path=path, gpus_per_node=gpus_per_node)
    if fmt == "slurm":
        return parse_slurm_topology(text, path=path, gpus_per_node=gpus_per_node)
    raise FabricImportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def import_fabric_file(*, owner: Organization, name: str, text: str, fmt: str, path: str,
                       gpus_per_node: int = 8) -> ImportResult:
    try:
        spec = parse_fabric_file(text, fmt=fmt, path=path, gpus_per_node=gpus_per_node)
    except FabricFormatError as exc:
        raise FabricImportError(str(exc)) from exc
    return save_fabric(owner=owner, name=name, spec=spec, source=fmt)


def _decimal(rate: float | None) -> Decimal | None:
    return None if rate is None else Decimal(str(rate))


@transaction.atomic
def save_fabric(*, owner: Organization, name: str, spec: FabricSpec, source: str) -> ImportResult:
    if not spec.hcas:
        raise FabricImportError(f"{spec.source or name}: the fabric has no hosts")
    if len(spec.hosts) > MAX_HOSTS_PER_FABRIC:
        raise FabricImportError(f"{spec.source or name}: {len(spec.hosts)} hosts, more than the "
                                f"{MAX_HOSTS_PER_FABRIC} a fabric may have")
    levels = analyse(spec)
    summary = summarise(spec)
    rates = Counter(link.rate_gbps for link in spec.links if link.rate_gbps)
    kind = "single-switch" if len(spec.switches) == 1 else spec.kind
    fabric = Fabric.objects.select_for_update().filter(name=name).first()
    created = fabric is None
    if fabric is not None and fabric.owner_id != owner.id:
        raise FabricImportError(f"fabric {name!r} belongs to another organisation")
    host_gbps, leaf_uplinks, spine_uplinks = bandwidth_inputs(spec, levels)
    summary["uplink_gbps"] = {"leaf": leaf_uplinks, "spine": spine_uplinks}
    values = {
        "kind": kind, "source": source, "summary": summary,
        "link_rate_gbps": _decimal(rates.most_common(1)[0][0]) if rates else None,
        "torus_dims": list(spec.torus_dims) if spec.torus_dims else None,
        # links are rebuilt below: the fabric agent's next report sends its topology again
        "live_topology_hash": "",
    }
    if created:
        fabric = Fabric.objects.create(owner=owner, name=name, **values)
    else:
        Fabric.objects.filter(pk=fabric.pk).update(**values)
        FabricRoutes.objects.filter(fabric=fabric).delete()  # the agent sends them again
        fabric.refresh_from_db()
    _save_switches(fabric, spec, levels.tiers)
    host_ids = _save_hosts(fabric, spec, levels.nodes, host_gbps)
    _save_ports_and_links(fabric, spec, host_ids)
    analyze_after_bulk_load(Switch, Host, Hca, Link, Port, rows=len(spec.links))
    return ImportResult(fabric=fabric, created=created, summary=summary)


def _save_switches(fabric: Fabric, spec: FabricSpec, tiers: dict[str, str]) -> None:
    rows = [
        Switch(fabric=fabric, guid=s.guid, name=s.name, tier=tiers.get(s.guid, s.tier or "leaf"),
               port_count=s.ports, group=s.group or "", coords=list(s.coords) if s.coords else None)
        for s in spec.switches
    ]
    Switch.objects.bulk_create(
        rows, batch_size=BATCH, update_conflicts=True, unique_fields=["fabric", "guid"],
        update_fields=["name", "tier", "port_count", "group", "coords"],
    )
    Switch.objects.filter(fabric=fabric).exclude(guid__in=[s.guid for s in spec.switches]).delete()


def _save_hosts(fabric, spec, domains, host_gbps) -> dict[str, int]:
    rows = [
        Host(fabric=fabric, name=host, leaf=d.leaf, spine=d.spine, gpus=spec.gpus_of(host),
             coords=list(d.coords) if d.coords else None, bandwidth_gbps=host_gbps.get(host, 0.0))
        for host, d in domains.items()
    ]
    Host.objects.bulk_create(
        rows, batch_size=BATCH, update_conflicts=True, unique_fields=["fabric", "name"],
        update_fields=["leaf", "spine", "gpus", "coords", "bandwidth_gbps"],
    )
    Host.objects.filter(fabric=fabric).exclude(name__in=list(domains)).delete()
    return dict(Host.objects.filter(fabric=fabric).values_list("name", "id"))


def _save_ports_and_links(fabric: Fabric, spec: FabricSpec, host_ids: dict[str, int]) -> None:
    # Ports and links belong to the fabric alone (nothing else points at them): rebuild them.
    Port.objects.filter(fabric=fabric).delete()
    Link.objects.filter(fabric=fabric).delete()
    hcas: dict[str, Hca] = {}
    for hca in spec.hcas:
        hcas.setdefault(hca.guid, Hca(fabric=fabric, guid=hca.guid, host_id=host_ids[hca.host],
                                      description=hca.description))
    Hca.objects.bulk_create(
        list(hcas.values()), batch_size=BATCH, update_conflicts=True,
        unique_fields=["fabric", "guid"], update_fields=["host", "description"],
    )
    Hca.objects.filter(fabric=fabric).exclude(guid__in=list(hcas)).delete()
    hca_ids = dict(Hca.objects.filter(fabric=fabric).values_list("guid", "id"))
    switch_ids = dict(Switch.objects.filter(fabric=fabric).values_list("guid", "id"))
    links = Link.objects.bulk_create(
        [Link(fabric=fabric, rate_gbps=_decimal(link.rate_gbps), width=link.width or "",
              state=link.state.lower()) for link in spec.links],
        batch_size=BATCH,
    )
    ports = []
    for row, link in zip(links, spec.links, strict=True):
        for end, guid, number in (("a", link.a_guid, link.a_port), ("b", link.b_guid, link.b_port)):
            ports.append(Port(
                fabric=fabric, switch_id=switch_ids.get(guid), hca_id=hca_ids.get(guid),
                number=number, device_guid=guid, link=row, link_end=end,
            ))
    Port.objects.bulk_create(ports, batch_size=BATCH)


# --- the fabric agent's reports ---------------------------------------------------------------

CHANGES_NAMED = 50  # link changes named one by one in the answer and the summary
UNMATCHED_NAMED = 20
MIN_SEEN_SHARE = 0.5  # a snapshot with fewer of the known links is a partial view


# Who wants to know that a fabric's routes or links changed (guarantees are checked again on
# them). The scheduler registers here (scheduler/apps.py): the fabric app may not import it.
# Listeners run inside the report's transaction: they should only enqueue work (the outbox).
_change_listeners: list[Callable[[int], object]] = []


def on_fabric_changed(listener: Callable[[int], object]) -> None:
    if listener not in _change_listeners:
        _change_listeners.append(listener)


class FabricReportRefused(Refusal):
    """A fabric agent's report that IBEX does not take; nothing has changed."""

    field = "fabric"


@transaction.atomic
def record_fabric_report(*, provider: Organization, fabric_name: str, report: dict,
                         now: datetime | None = None) -> dict:
    """Take one poll of the fabric agent (`fabric.core.fabric_report`, validated by the API):
    its links' states and rates, its ports' counters, and whether it reached the fabric at all.

    An unreachable poll changes nothing but the agent's status: IBEX keeps its last view. A
    reachable one with a topology sets every known link it lists to the state it reports and
    every known link it does not list to `down`. Reports of one fabric are taken one at a time
    (the fabric's row is locked) and a report older than the view IBEX holds changes no link.
    """
    now = now or timezone.now()
    fabric = Fabric.objects.select_for_update().filter(name=fabric_name).first()
    if fabric is None or fabric.owner_id != provider.id:
        # another provider's fabric is as unknown as a missing one: nothing to learn from a 404
        raise FabricReportRefused(f"you have no fabric {fabric_name!r}: import it first",
                                  code="not_found")
    updates: dict = {"agent_seen_at": now, "agent_reachable": report["reachable"],
                     "agent_error": report.get("error", "")[:500]}
    summary = dict(fabric.live_summary or {})
    if report.get("subnet_manager") is not None:
        summary["subnet_manager"] = report["subnet_manager"]
    if "provider_pkeys" in report:  # what partitions.conf holds outside IBEX's block
        updates["provider_pkeys"] = sorted(set(report["provider_pkeys"]))
    answer: dict = {"fabric": fabric.name, "reachable": report["reachable"], "changed": [],
                    "unmatched_links": summary.get("unmatched_links", 0),
                    "counters": {"stored": 0, "unmatched": 0}, "routes_changed": False}
    if report["reachable"]:
        observed_at = report["observed_at"]
        fresh = fabric.live_seen_at is None or observed_at > fabric.live_seen_at
        if fresh and "links" in report:
            changed, unmatched, partial = _follow_links(fabric, report["links"], observed_at)
            updates["live_topology_hash"] = report["topology_hash"]
            summary["unmatched_links"] = len(unmatched)
            summary["unmatched_sample"] = unmatched[:UNMATCHED_NAMED]
            summary["partial_view"] = partial
            answer.update(changed=changed, unmatched_links=len(unmatched))
            fabric.live_topology_hash = report["topology_hash"]
        if fresh and "routes" in report:
            answer["routes_changed"] = _store_routes(fabric, report, observed_at)
        if fresh:
            updates["live_seen_at"] = observed_at
        answer["counters"] = _store_counters(fabric, report.get("counters", []), observed_at)
        summary["counters"] = answer["counters"]
        summary["counter_errors"] = report.get("counter_errors", [])[:20]
        summary["state_error"] = report.get("state_error", "")
        summary["poll_s"] = report.get("poll_s")
        summary["routes_error"] = report.get("routes_error", "")
    states = dict(Link.objects.filter(fabric=fabric).values_list("state")
                  .annotate(count=Count("id")).order_by())
    summary["links"] = {state: states.get(state, 0) for state in Link.State.values}
    updates["live_summary"] = summary
    Fabric.objects.filter(pk=fabric.pk).update(**updates)
    if answer["changed"] or answer["routes_changed"]:
        for listener in _change_listeners:
            listener(fabric.pk)
    held = FabricRoutes.objects.filter(fabric=fabric).values_list("routes_hash", flat=True).first()
    answer.update(topology_hash=fabric.live_topology_hash, links=summary["links"],
                  routes_hash=held or "",
                  partial_view=summary.get("partial_view", False),
                  partitions=live_partitions(fabric), qos=qos_answer(fabric))
    return answer


def _follow_links(fabric: Fabric, live_links: list[dict], observed_at: datetime):
    """Set each known link to what the agent saw: its state and rate, or `down` when it is not
    in the snapshot. The changes (named for people), the cables IBEX does not know, and whether
    the snapshot was a partial view.

    A snapshot that holds fewer than `MIN_SEEN_SHARE` of the known links is a partial view, not
    a fabric mostly down: the agent's own uplinks cut (it sees its leaf and no further), or a
    fabric imported from a file whose GUIDs are not the live ones (a Slurm topology.conf). The
    links it sees are taken; those it does not see keep their state."""
    ends: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for link_id, guid, number in Port.objects.filter(fabric=fabric, link__isnull=False) \
            .order_by("link_id", "link_end").values_list("link_id", "device_guid", "number"):
        ends[link_id].append((guid, number))  # the A end (the HCA, or the lower tier) first
    known = {link_key(*pair[0], *pair[1]): link_id for link_id, pair in ends.items()
             if len(pair) == 2}
    live = {link_key(item["a"]["guid"], item["a"]["port"], item["b"]["guid"], item["b"]["port"]):
            item for item in live_links}
    links = Link.objects.filter(fabric=fabric).in_bulk(list(known.values()))
    partial = sum(key in live for key in known) < len(known) * MIN_SEEN_SHARE
    updated, history, changed, flips = [], [], [], []
    names = None
    for key, link_id in known.items():
        link, seen = links[link_id], live.get(key)
        if seen is None and partial:
            continue  # a partial view says nothing of the cables it does not reach
        state = seen["state"] if seen else Link.State.DOWN
        rate = _decimal(seen.get("rate_gbps")) if seen else None
        width = (seen.get("width") or "") if seen else ""
        before = (link.state, link.rate_gbps, link.width)
        if seen and rate is not None:
            link.rate_gbps, link.width = rate, width or link.width
        if state != link.state:
            history.append(LinkStateChange(fabric=fabric, link=link, at=observed_at,
                                           from_state=link.state, to_state=state))
            flips.append((link_id, before[0], state))
            link.state, link.state_changed_at = state, observed_at
            if len(changed) < CHANGES_NAMED:
                names = names or device_names(fabric)
                changed.append({"link": link.id, "name": link_name(ends[link_id], names),
                                "from": before[0], "to": state})
        if (link.state, link.rate_gbps, link.width) != before:
            updated.append(link)
    Link.objects.bulk_update(updated, ["state", "rate_gbps", "width", "state_changed_at"],
                             batch_size=BATCH)
    LinkStateChange.objects.bulk_create(history, batch_size=BATCH)
    if flips:
        names = names or device_names(fabric)
        _follow_down_faults(fabric, flips, {link_id: link_name(ends[link_id], names)
                                            for link_id, _, _ in flips}, observed_at)
    unmatched = [key for key in live if key not in known]
    if unmatched:
        names = names or device_names(fabric)
    return changed, [link_name(key, names) for key in unmatched], partial


def _store_routes(fabric: Fabric, report: dict, observed_at: datetime) -> bool:
    """The routes snapshot replaces the one held (one row a fabric); whether they changed."""
    routes = report["routes"]
    held = FabricRoutes.objects.filter(fabric=fabric).values_list("routes_hash", flat=True).first()
    if held == report["routes_hash"]:
        return False
    FabricRoutes.objects.update_or_create(fabric=fabric, defaults={
        "routes_hash": report["routes_hash"], "observed_at": observed_at,
        "lids": routes["lids"], "tables": routes["switches"]})
    return True


def device_names(fabric: Fabric) -> dict[str, str]:
    """GUID -> what a person calls the device: the switch's name, the HCA's description."""
    names = dict(Switch.objects.filter(fabric=fabric).values_list("guid", "name"))
    for guid, description, host in Hca.objects.filter(fabric=fabric) \
            .values_list("guid", "description", "host__name"):
        names[guid] = description or host
    return names


def link_name(ends, names: dict[str, str]) -> str:
    """``"node01 mlx5_0 port 1 - leaf01 port 3"``; a device IBEX does not know by its GUID."""
    (a_guid, a_port), (b_guid, b_port) = ends
    return f"{names.get(a_guid, a_guid)} port {a_port} - {names.get(b_guid, b_guid)} port {b_port}"


def _store_counters(fabric: Fabric, counters: list[dict], observed_at: datetime) -> dict:
    """Each port's new sample becomes its latest, the latest its previous. A sample no newer
    than the one held (a report delivered twice, or late) is dropped. The new samples then
    feed the leases' traffic accounts and the links' error faults."""
    if not counters:
        return {"stored": 0, "unmatched": 0}
    places: dict[int, tuple[int | None, int | None]] = {}
    port_ids = {}
    for port_id, guid, number, link_id, host_id in Port.objects.filter(fabric=fabric) \
            .values_list("id", "device_guid", "number", "link_id", "hca__host_id"):
        port_ids[(guid, number)] = port_id
        places[port_id] = (link_id, host_id)
    held = {row.port_id: row for row in PortCounters.objects.filter(fabric=fabric)}
    rows, unmatched = [], 0
    for sample in counters:
        port_id = port_ids.get((sample["guid"], sample["port"]))
        if port_id is None:
            unmatched += 1
            continue
        old = held.get(port_id)
        if old is not None and old.sampled_at >= observed_at:
            continue
        row = PortCounters(fabric=fabric, port_id=port_id, sampled_at=observed_at,
                           extended=sample.get("extended", False),
                           previous_sampled_at=old.sampled_at if old else None)
        for name in COUNTER_NAMES:
            setattr(row, name, sample[name])
            setattr(row, f"previous_{name}", getattr(old, name) if old else None)
        rows.append(row)
    PortCounters.objects.bulk_create(
        rows, batch_size=BATCH, update_conflicts=True, unique_fields=["port"],
        update_fields=["sampled_at", "extended", "previous_sampled_at", *COUNTER_NAMES,
                       *(f"previous_{name}" for name in COUNTER_NAMES)],
    )
    _count_traffic(fabric, rows, places)
    _follow_error_faults(fabric, rows, places, observed_at)
    return {"stored": len(rows), "unmatched": unmatched}


# --- link health and delivered bandwidth -------------------------------------------------------


def sample_of(row: PortCounters) -> bandwidth.Sample:
    """A stored port's two samples as the pure core reads them."""
    return bandwidth.Sample(
        at=row.sampled_at.timestamp(),
        previous_at=row.previous_sampled_at.timestamp() if row.previous_sampled_at else None,
        extended=row.extended, xmit_data=row.xmit_data,
        previous_xmit_data=row.previous_xmit_data,
        errors={name: getattr(row, name) for name in bandwidth.ERROR_COUNTERS},
        previous_errors={name: getattr(row, f"previous_{name}")
                         for name in bandwidth.ERROR_COUNTERS})


def _follow_down_faults(fabric: Fabric, flips: list[tuple[int, str, str]], names: dict[int, str],
                        at: datetime) -> None:
    """A link that went down opens a `down` fault; one that is active again closes it (`init`
    and `armed` carry no data yet: the fault stays open until `active`)."""
    went_down = [link_id for link_id, _, to in flips if to == Link.State.DOWN]
    came_back = [link_id for link_id, _, to in flips if to == Link.State.ACTIVE]
    if came_back:
        LinkFault.objects.filter(link_id__in=came_back, kind=LinkFault.Kind.DOWN,
                                 ended_at__isnull=True).update(ended_at=at)
    if went_down:
        LinkFault.objects.bulk_create(
            [LinkFault(fabric=fabric, link_id=link_id, kind=LinkFault.Kind.DOWN,
                       name=names[link_id][:300], detail="down", started_at=at)
             for link_id in went_down], ignore_conflicts=True)


def _follow_error_faults(fabric: Fabric, rows: list[PortCounters],
                         places: dict[int, tuple[int | None, int | None]],
                         at: datetime) -> None:
    """Each link whose ends were sampled: above the fabric's threshold (errors per minute of both
    ends) opens an `errors` fault, at or below it closes one; an interval with no figure (a
    reset, a saturated counter) changes nothing."""
    by_link: dict[int, list[bandwidth.Sample]] = defaultdict(list)
    for row in rows:
        link_id = places[row.port_id][0]
        if link_id is not None:
            by_link[link_id].append(sample_of(row))
    erring, calm = {}, []
    for link_id, samples in by_link.items():
        rate = bandwidth.errors_per_minute(samples)
        over = bandwidth.over_threshold(rate, fabric.error_threshold)
        if over:
            erring[link_id] = rate
        elif over is False:
            calm.append(link_id)
    if calm:
        LinkFault.objects.filter(link_id__in=calm, kind=LinkFault.Kind.ERRORS,
                                 ended_at__isnull=True).update(ended_at=at)
    if not erring:
        return
    already = set(LinkFault.objects.filter(link_id__in=list(erring), kind=LinkFault.Kind.ERRORS,
                                           ended_at__isnull=True).values_list("link_id", flat=True))
    new = [link_id for link_id in erring if link_id not in already]
    if not new:
        return
    ends: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for link_id, guid, number in Port.objects.filter(link_id__in=new).order_by(
            "link_id", "link_end").values_list("link_id", "device_guid", "number"):
        ends[link_id].append((guid, number))
    names = device_names(fabric)
    LinkFault.objects.bulk_create(
        [LinkFault(fabric=fabric, link_id=link_id, kind=LinkFault.Kind.ERRORS,
                   name=link_name(ends[link_id], names)[:300], started_at=at,
                   detail=f"{erring[link_id]:.1f} errors/min > {fabric.error_threshold}")
         for link_id in new if len(ends[link_id]) == 2], ignore_conflicts=True)


def _count_traffic(fabric: Fabric, rows: list[PortCounters],
                   places: dict[int, tuple[int | None, int | None]]) -> None:
    """Add each host's interval (its HCA ports' PortXmitData, all read in this poll) to the
    open traffic accounts of the leases on it, when the interval started after the lease came
    onto the host. A host with a port that gave no figure adds nothing this interval. One
    UPDATE for the whole report (a bulk_update of thousands of accounts is seconds)."""
    by_host: dict[int, list[bandwidth.Sample]] = defaultdict(list)
    for row in rows:
        host_id = places[row.port_id][1]
        if host_id is not None:
            by_host[host_id].append(sample_of(row))
    if not by_host:
        return
    cabled = Counter(host_id for link_id, host_id in places.values()
                     if host_id in by_host and link_id is not None)
    values, params = [], []
    for host_id, samples in by_host.items():
        interval = bandwidth.host_interval(samples) if len(samples) == cabled[host_id] else None
        if interval is None:
            continue
        values.append("(%s::bigint, %s::bigint, %s::timestamptz, %s::timestamptz)")
        params += [host_id, interval.words, datetime.fromtimestamp(interval.started_at, tz=UTC),
                   datetime.fromtimestamp(interval.ended_at, tz=UTC)]
    if not values:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE fabric_trafficaccount AS account
            SET words = account.words + v.words,
                first_at = LEAST(COALESCE(account.first_at, v.started), v.started),
                last_at = v.ended
            FROM (VALUES {", ".join(values)}) AS v(host_id, words, started, ended)
            WHERE account.host_id = v.host_id AND account.closed_at IS NULL
              AND account.opened_at <= v.started
            """, params)


@transaction.atomic(savepoint=False)  # inside the binding's transaction
def track_lease_hosts(*, hosts_by_holder: dict[str, list[int]],
                      now: datetime | None = None) -> None:
    """Each lease's traffic accounts follow the hosts it is on now (`holder` → host ids, from the
    pool's bindings, as `sync_partitions`): a host it came onto opens an account, one it left
    closes its account. Called whenever the pool binds or unbinds a lease."""
    if not hosts_by_holder:
        return
    now = now or timezone.now()
    wanted = {(holder, host) for holder, hosts in hosts_by_holder.items()
              for host in hosts if host is not None}
    open_now = {(a.holder, a.host_id): a.pk for a in TrafficAccount.objects.filter(
        holder__in=list(hosts_by_holder), closed_at__isnull=True)}
    gone = [pk for key, pk in open_now.items() if key not in wanted]
    if gone:
        TrafficAccount.objects.filter(pk__in=gone).update(closed_at=now)
    new = sorted(key for key in wanted if key not in open_now)
    if new:
        TrafficAccount.objects.bulk_create(
            [TrafficAccount(holder=holder, host_id=host, opened_at=now) for holder, host in new],
            ignore_conflicts=True)


# --- partitions: a P_Key per lease ------------------------------------------------------------

PKEY_TRIES = 20  # P_Keys tried when concurrent placements take the ones read as free


class PartitionsExhausted(Refusal):
    """No P_Key of the fabric's range is free: a lease on several nodes cannot be isolated."""

    field = "fabric"
    code = "pkeys_exhausted"


def format_pkey(pkey: int | None) -> str | None:
    return None if pkey is None else f"{pkey:#06x}"


@transaction.atomic(savepoint=False)  # inside the binding's transaction: no savepoint of its own
def sync_partitions(*, hosts_by_holder: dict[str, list[int]],
                    classes: dict[str, str] | None = None,
                    gpus_by_holder: dict[str, dict[int, list[int]]] | None = None,
                    now: datetime | None = None) -> None:
    """Each lease's partitions follow the hosts it is on now (`holder` → host ids, from the
    pool's bindings): on every fabric where it is on two hosts or more it has a live partition
    with exactly those hosts (a new one gets a free P_Key of the fabric's range; one that moves
    keeps its P_Key), and on every other fabric its partition, if any, is released. Called
    whenever the pool binds or unbinds a lease; a few queries however many leases.

    PostgreSQL decides which P_Keys are free (`pkey_in_one_live_partition_per_fabric`): two
    placements that pick the same one concurrently both succeed, with different P_Keys.

    `classes` (holder → bandwidth class, from the market through the pool) sets each named
    lease's class on its partitions, whose P_Key the fabric agent then maps to that class's SL;
    a lease not named keeps its class (a new partition: standard).

    `gpus_by_holder` (holder → host id → its GPU indexes there) narrows each host's members to
    the HCAs of the rails those GPUs use, on hosts with several HCAs (docs/fabric.md,
    "Partitions"); without it, every HCA of the host is a member."""
    classes = classes or {}
    gpus_by_holder = gpus_by_holder or {}
    if not hosts_by_holder:
        return
    now = now or timezone.now()
    several = {host for hosts in hosts_by_holder.values() if len(set(hosts)) >= 2
               for host in hosts}  # hosts of leases that may need a partition
    fabric_of = dict(Host.objects.filter(pk__in=several).values_list("pk", "fabric_id")) \
        if several else {}
    wanted: dict[tuple[int, str], set[int]] = {}
    for holder, hosts in hosts_by_holder.items():
        per_fabric: dict[int, set[int]] = defaultdict(set)
        for host in hosts:
            if host in fabric_of:
                per_fabric[fabric_of[host]].add(host)
        for fabric_id, members in per_fabric.items():
            if len(members) >= 2:  # a lease on one node needs no partition
                wanted[(fabric_id, holder)] = members
    live = {(p.fabric_id, p.holder): p for p in Partition.objects.select_for_update()
            .filter(holder__in=list(hosts_by_holder), released_at__isnull=True)}
    gone = [p.pk for key, p in live.items() if key not in wanted]
    if gone:
        Partition.objects.filter(pk__in=gone).update(released_at=now)
    through = Partition.hosts.through
    members_now: dict[int, set[int]] = defaultdict(set)
    for partition_id, host_id in through.objects.filter(
            partition_id__in=[p.pk for key, p in live.items() if key in wanted]) \
            .values_list("partition_id", "host_id"):
        members_now[partition_id].add(host_id)
    fabrics = Fabric.objects.in_bulk({fabric_id for fabric_id, _ in wanted})
    shape_of = {pk: (gpus, hcas) for pk, gpus, hcas in Host.objects.filter(
        pk__in={h for members in wanted.values() for h in members}).annotate(
        hca_count=Count("hcas")).values_list("pk", "gpus", "hca_count")}
    for (fabric_id, holder), members in sorted(wanted.items()):
        partition = live.get((fabric_id, holder))
        bandwidth_class = classes.get(holder)
        if partition is None:
            partition = _new_partition(fabrics[fabric_id], holder,
                                       bandwidth_class or qos_core.STANDARD)
        elif bandwidth_class and partition.bandwidth_class != bandwidth_class:
            Partition.objects.filter(pk=partition.pk).update(bandwidth_class=bandwidth_class)
        if members_now[partition.pk] != members:
            partition.hosts.set(sorted(members))
        rails = _rails_of(members, gpus_by_holder.get(holder, {}), shape_of)
        if rails != partition.rails:
            Partition.objects.filter(pk=partition.pk).update(rails=rails)


def _rails_of(members: set[int], gpus: dict[int, list[int]],
              shape_of: dict[int, tuple[int, int]]) -> dict[str, list[int]]:
    """Host id (as text: JSON's keys) → the rails its lease's GPUs use, for the members with
    several HCAs and known GPUs."""
    rails = {}
    for host in sorted(members):
        gpus_on_host, hcas = shape_of.get(host, (0, 0))
        used = partitions_core.rails_used(gpus.get(host, []), hcas, gpus_on_host)
        if used is not None:
            rails[str(host)] = used
    return rails


def _new_partition(fabric: Fabric, holder: str, bandwidth_class: str) -> Partition:
    """A live partition with the lowest P_Key of the fabric's range that no live partition and
    no provider's line holds. A concurrent placement that took the same P_Key first makes the
    insert fail (the unique constraint, or PostgreSQL breaking a deadlock between two such
    inserts): that P_Key is skipped and the next one tried, in a savepoint so that the
    caller's transaction goes on."""
    taken = set(Partition.objects.filter(fabric=fabric, released_at__isnull=True)
                .values_list("pkey", flat=True))
    taken |= set(fabric.provider_pkeys or [])
    for _try in range(PKEY_TRIES):
        pkey = next((key for key in range(fabric.pkey_first, fabric.pkey_last + 1)
                     if key not in taken), None)
        if pkey is None:
            break
        try:
            with transaction.atomic():
                return Partition.objects.create(fabric=fabric, pkey=pkey, holder=holder,
                                                bandwidth_class=bandwidth_class)
        except IntegrityError as exc:
            if "pkey_in_one_live_partition_per_fabric" not in str(exc):
                raise
        except OperationalError as exc:
            if "deadlock" not in str(exc):
                raise
        taken.add(pkey)
    raise PartitionsExhausted(
        f"fabric {fabric.name}: no free P_Key between {format_pkey(fabric.pkey_first)} and "
        f"{format_pkey(fabric.pkey_last)} for {holder}")


class PkeyRangeRefused(Refusal):
    field = "pkey_range"


@transaction.atomic
def set_pkey_range(*, fabric: Fabric, first: int, last: int) -> Fabric:
    """The provider's P_Key range for leases' partitions (validated by the API: 15 bits, first
    no higher than last). Refused when it holds a P_Key of the provider's own partition lines.
    Live partitions outside it keep their P_Key until their lease ends."""
    locked = Fabric.objects.select_for_update().get(pk=fabric.pk)
    own = sorted(key for key in locked.provider_pkeys or [] if first <= key <= last)
    if own:
        raise PkeyRangeRefused(
            f"overlaps the P_Keys of your own partition lines: "
            f"{', '.join(format_pkey(key) for key in own[:10])}")
    Fabric.objects.filter(pk=locked.pk).update(pkey_first=first, pkey_last=last)
    locked.pkey_first, locked.pkey_last = first, last
    return locked


# --- bandwidth classes: the provider's QoS settings -------------------------------------------


class QosSettingsRefused(Refusal):
    field = "qos"


@transaction.atomic
def set_qos(*, fabric: Fabric, change: dict) -> Fabric:
    """The provider's QoS settings (docs/fabric.md, "Bandwidth classes"): `change` over the
    fabric's current ones (a key left out keeps its value), all checked together before
    anything is written. The fabric agent's next answer carries them to OpenSM."""
    locked = Fabric.objects.select_for_update().get(pk=fabric.pk)
    try:
        settings = qos_core.validate(qos_core.merge(qos_core.settings_of(locked.qos), change))
    except qos_core.QosSettingsError as exc:
        raise QosSettingsRefused(exc.message, field=exc.field) from None
    Fabric.objects.filter(pk=locked.pk).update(qos=settings)
    locked.qos = settings
    return locked


class ErrorThresholdRefused(Refusal):
    field = "error_threshold"


@transaction.atomic
def update_fabric_settings(*, fabric: Fabric, pkey_range: dict | None = None,
                           error_threshold: int | None = None) -> Fabric:
    """The provider's settings of a fabric, all or none: its P_Key range ({first, last}) and its
    link error threshold (errors per minute; faults open and close against it from the next
    report on)."""
    if error_threshold is not None and not 0 <= error_threshold <= ERROR_THRESHOLD_MAX:
        raise ErrorThresholdRefused(f"between 0 and {ERROR_THRESHOLD_MAX} errors per minute")
    if pkey_range is not None:
        fabric = set_pkey_range(fabric=fabric, first=pkey_range["first"], last=pkey_range["last"])
    if error_threshold is not None:
        Fabric.objects.filter(pk=fabric.pk).update(error_threshold=error_threshold)
        fabric.error_threshold = error_threshold
    return fabric
@transaction.atomic
def set_guarantee_ratio(*, fabric: Fabric, ratio: Decimal) -> Fabric:
    """The share of each link's rate that guarantees may take together (0 < ratio ≤ 1, checked
    by the API and by PostgreSQL). The fabric's live guarantees are checked again on it (the
    change listeners, as after a report that changes links)."""
    locked = Fabric.objects.select_for_update().get(pk=fabric.pk)
    Fabric.objects.filter(pk=locked.pk).update(guarantee_ratio=ratio)
    locked.guarantee_ratio = ratio
    for listener in _change_listeners:
        listener(locked.pk)
    return locked

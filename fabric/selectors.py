"""Read-only views of fabrics built from the database in a few bulk queries."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal

from django.core.cache import cache
from django.db.models import Count, Max

from fabric.core import bandwidth
from fabric.core import partitions as partitions_core
from fabric.core import qos as qos_core
from fabric.core.levels import NodeDomains
from fabric.core.routes import RouteMap, decode_table, derived_route_map
from fabric.core.slurm import export_slurm_block, export_slurm_tree
from fabric.core.spec import FabricSpec, HcaSpec, LinkSpec, SwitchSpec
from fabric.core.topology import SnapshotNode, TopologySnapshot
from fabric.models import (
    Fabric,
    FabricRoutes,
    Hca,
    Host,
    Link,
    LinkFault,
    Partition,
    Port,
    Switch,
    TrafficAccount,
)

EXPORT_FORMATS = ("slurm-tree", "slurm-block")


def _host_rows(fabric: Fabric):
    return Host.objects.filter(fabric=fabric).values_list(
        "name", "leaf", "spine", "gpus", "coords", "bandwidth_gbps"
    ).iterator(chunk_size=20_000)


def load_snapshot(fabric: Fabric) -> TopologySnapshot:
    """The fabric's immutable topology snapshot: one query over its hosts."""
    nodes, host_gbps = [], {}
    for name, leaf, spine, gpus, coords, gbps in _host_rows(fabric):
        nodes.append(SnapshotNode(name, leaf, spine, gpus, tuple(coords) if coords else None))
        host_gbps[name] = gbps
    uplinks = fabric.summary.get("uplink_gbps", {})
    return TopologySnapshot.from_domains(
        nodes, kind=fabric.kind if fabric.kind != "single-switch" else "fat-tree",
        name=fabric.name, torus_dims=tuple(fabric.torus_dims) if fabric.torus_dims else None,
        host_gbps=host_gbps, leaf_uplink_gbps=uplinks.get("leaf"),
        spine_uplink_gbps=uplinks.get("spine"),
    )


def load_spec(fabric: Fabric) -> FabricSpec:
    """The fabric as a spec again, with its stored GUIDs, names, port numbers and link rates
    (what an ibsim net file needs to simulate exactly the fabric IBEX holds), in four queries.
    A single-switch fabric comes back as a fat tree of one switch."""
    switches = tuple(
        SwitchSpec(guid, name, tier, ports, group or None, tuple(coords) if coords else None)
        for guid, name, tier, ports, group, coords in Switch.objects.filter(fabric=fabric)
        .order_by("name").values_list("guid", "name", "tier", "port_count", "group", "coords"))
    hca_of = {guid: (host, description) for guid, host, description in Hca.objects.filter(
        fabric=fabric).values_list("guid", "host__name", "description")}
    ends: dict[int, dict[str, tuple[str, int]]] = {}
    rates: dict[int, tuple] = {}
    hcas = []
    for link_id, end, guid, number, rate, width, state in Port.objects.filter(
            fabric=fabric, link__isnull=False).order_by("link_id").values_list(
            "link_id", "link_end", "device_guid", "number", "link__rate_gbps", "link__width",
            "link__state"):
        ends.setdefault(link_id, {})[end] = (guid, number)
        rates[link_id] = (float(rate) if rate is not None else None, width or None, state)
        if guid in hca_of:
            host, description = hca_of[guid]
            hcas.append(HcaSpec(guid, host, number, description))
    links = tuple(LinkSpec(*pair["a"], *pair["b"], rates[link_id][0], rates[link_id][1],
                           rates[link_id][2].capitalize())
                  for link_id, pair in ends.items() if len(pair) == 2)
    gpus = dict(Host.objects.filter(fabric=fabric).values_list("name", "gpus"))
    kind = "fat-tree" if fabric.kind == Fabric.Kind.SINGLE_SWITCH else fabric.kind
    return FabricSpec(kind, switches, tuple(sorted(hcas, key=lambda h: (h.host, h.guid, h.port))),
                      links, gpus, tuple(fabric.torus_dims) if fabric.torus_dims else None)


def node_domains(fabric: Fabric) -> dict[str, NodeDomains]:
    return {
        name: NodeDomains(leaf=leaf, spine=spine, coords=tuple(coords) if coords else None)
        for name, leaf, spine, _gpus, coords, _gbps in _host_rows(fabric)
    }


def export_topology_conf(fabric: Fabric, fmt: str) -> str:
    domains = node_domains(fabric)
    if fmt == "slurm-tree":
        rate = float(fabric.link_rate_gbps) if fabric.link_rate_gbps is not None else None
        return export_slurm_tree(domains, top_name=fabric.name, link_speed=rate)
    if fmt == "slurm-block":
        return export_slurm_block(domains)
    raise ValueError(f"unknown export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")


def pkeys_of(holders: list[str]) -> dict[str, str]:
    """Each lease's live P_Key (`0x1a2b`), by its reference; a lease with none is left out
    (one on several fabrics: the P_Key of the fabric where it has the most nodes)."""
    found: dict[str, tuple[int, int]] = {}
    for holder, pkey, hosts in Partition.objects.filter(
            holder__in=list(holders), released_at__isnull=True).annotate(
            members=Count("hosts")).values_list("holder", "pkey", "members"):
        if holder not in found or hosts > found[holder][1]:
            found[holder] = (pkey, hosts)
    return {holder: f"{pkey:#06x}" for holder, (pkey, _) in found.items()}


def live_partitions(fabric: Fabric) -> list[dict]:
    """The fabric's live partitions as the fabric agent writes them: each P_Key with the HCA
    ports (node GUID and port number, cabled in IBEX's view) of every host of its lease (of
    the rails its GPUs use, where the host has several HCAs), in P_Key order. The agent turns
    them into port GUIDs with its own discovery."""
    partitions = list(Partition.objects.filter(fabric=fabric, released_at__isnull=True)
                      .order_by("pkey").values_list("pk", "pkey", "holder", "rails"))
    members: dict[int, list[int]] = {}
    for partition_id, host_id in Partition.hosts.through.objects.filter(
            partition_id__in=[pk for pk, *_ in partitions]).values_list("partition_id",
                                                                        "host_id"):
        members.setdefault(partition_id, []).append(host_id)
    rails = _ports_by_rail(fabric, {h for hosts in members.values() for h in hosts})
    return [{"pkey": f"{pkey:#06x}", "lease": holder,
             "members": [{"guid": guid, "port": number} for guid, number in sorted(
                 {port for host in members.get(pk, [])
                  for position, ports in enumerate(rails.get(host, []))
                  if str(host) not in used or position in used[str(host)]
                  for port in ports})]}
            for pk, pkey, holder, used in partitions]


def _ports_by_rail(fabric: Fabric, hosts: set[int]) -> dict[int, list[list[tuple[str, int]]]]:
    """Host id → its HCAs' cabled ports, one list per HCA in rail order."""
    by_hca: dict[int, dict[tuple, list[tuple[str, int]]]] = {}
    for host_id, description, hca_guid, guid, number in Port.objects.filter(
            fabric=fabric, hca__isnull=False, hca__host_id__in=hosts).values_list(
            "hca__host_id", "hca__description", "hca__guid", "device_guid", "number"):
        order = partitions_core.rail_order(description, hca_guid)
        by_hca.setdefault(host_id, {}).setdefault(order, []).append((guid, number))
    return {host: [ports for _order, ports in sorted(hcas.items())]
            for host, hcas in by_hca.items()}


def qos_answer(fabric: Fabric) -> dict:
    """What the fabric agent applies of the bandwidth classes: the opensm.conf QoS options
    and each live partition's P_Key to its class's SL (qos-policy.conf)."""
    settings = qos_core.settings_of(fabric.qos)
    return {"options": qos_core.opensm_options(settings),
            "default_sl": qos_core.sl_of(settings, qos_core.STANDARD),
            "pkeys": [{"pkey": f"{pkey:#06x}", "class": name, "sl": qos_core.sl_of(settings, name)}
                      for pkey, name in Partition.objects.filter(
                          fabric=fabric, released_at__isnull=True).order_by("pkey")
                      .values_list("pkey", "bandwidth_class")]}


def fastest_link_gbps() -> Decimal | None:
    """The fastest link rate of any fabric (its cables as last seen, else the rate it was
    imported with): no guarantee per GPU can be above it. None: no fabric."""
    cables = Link.objects.aggregate(fastest=Max("rate_gbps"))["fastest"]
    return cables or Fabric.objects.aggregate(fastest=Max("link_rate_gbps"))["fastest"]


# --- measured bandwidth and health (docs/fabric.md, "Measured bandwidth and health") -----------


def _sample(counters) -> bandwidth.Sample:
    return bandwidth.Sample(
        at=counters.sampled_at.timestamp(),
        previous_at=(counters.previous_sampled_at.timestamp()
                     if counters.previous_sampled_at else None),
        extended=counters.extended, xmit_data=counters.xmit_data,
        previous_xmit_data=counters.previous_xmit_data,
        errors={name: getattr(counters, name) for name in bandwidth.ERROR_COUNTERS},
        previous_errors={name: getattr(counters, f"previous_{name}")
                         for name in bandwidth.ERROR_COUNTERS})


def _iso(moment: float | None) -> str | None:
    if moment is None:
        return None
    return datetime.fromtimestamp(moment, tz=UTC).isoformat().replace("+00:00", "Z")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def host_intervals(host_ids) -> dict[int, bandwidth.HostInterval | None]:
    """Each host's last interval over its cabled HCA ports (None: a port not sampled, or no
    figure), in one query."""
    samples: dict[int, list] = defaultdict(list)
    for port in Port.objects.filter(hca__host_id__in=list(host_ids), link__isnull=False) \
            .select_related("counters", "hca"):
        counters = getattr(port, "counters", None)
        samples[port.hca.host_id].append(None if counters is None else _sample(counters))
    return {host: None if any(s is None for s in found) else bandwidth.host_interval(found)
            for host, found in samples.items()}


def delivered_bandwidth(holders) -> dict[str, dict]:
    """Each lease's delivered bandwidth, by its reference, from its traffic accounts and its
    hosts' HCA port counters, in three queries however many leases:
    `{"last_interval": Gb/s | None, "mean": Gb/s | None, "sampled_at": ISO | None,
    "shared": bool}`. A lease with no account (never bound) is left out."""
    holders = list(holders)
    accounts: dict[str, list] = defaultdict(list)
    for row in TrafficAccount.objects.filter(holder__in=holders).values_list(
            "holder", "host_id", "opened_at", "closed_at", "words", "first_at", "last_at"):
        accounts[row[0]].append(row)
    open_hosts = {host for rows in accounts.values() for _, host, _, closed, *_ in rows
                  if closed is None}
    sharing: dict[int, int] = {}
    intervals: dict[int, bandwidth.HostInterval | None] = {}
    if open_hosts:
        sharing = dict(TrafficAccount.objects.filter(host_id__in=open_hosts, closed_at__isnull=True)
                       .values_list("host_id").annotate(leases=Count("holder", distinct=True))
                       .order_by())
        intervals = host_intervals(open_hosts)
    found = {}
    for holder, rows in accounts.items():
        live = [(host, opened) for _, host, opened, closed, *_ in rows if closed is None]
        last = None
        if live:
            last = bandwidth.last_interval_gbps((intervals.get(host), opened.timestamp())
                                                for host, opened in live)
        moments = [intervals[host].ended_at for host, _ in live if intervals.get(host)]
        mean = bandwidth.mean_gbps(
            (words, first.timestamp() if first else None, end.timestamp() if end else None)
            for *_, words, first, end in rows)
        found[holder] = {"last_interval": _rounded(last), "mean": _rounded(mean),
                         "sampled_at": _iso(max(moments) if moments else None),
                         "shared": any(sharing.get(host, 0) > 1 for host, _ in live)}
    return found


def hca_links_of_links(link_ids) -> list[tuple[int, int]]:
    """(link id, host id) for each of the links that is a host's HCA cable."""
    return list(Port.objects.filter(link_id__in=list(link_ids), hca__isnull=False)
                .values_list("link_id", "hca__host_id"))


def hca_cable_rails(link_ids) -> dict[int, tuple[int, int, int]]:
    """link id -> (host id, the HCA's rail, the host's HCAs) for each link that is a host's HCA
    cable: the rail is the HCA's place in its host's rail order."""
    cables = list(Port.objects.filter(link_id__in=list(link_ids), hca__isnull=False)
                  .values_list("link_id", "hca__host_id", "hca_id"))
    orders: dict[int, list[tuple[tuple, int]]] = {}
    for host_id, hca_id, description, guid in Hca.objects.filter(
            host_id__in={host for _, host, _ in cables}).values_list(
            "host_id", "pk", "description", "guid"):
        orders.setdefault(host_id, []).append((partitions_core.rail_order(description, guid),
                                               hca_id))
    rail_of = {hca_id: (rail, len(hcas)) for hcas in orders.values()
               for rail, (_order, hca_id) in enumerate(sorted(hcas))}
    return {link_id: (host_id, *rail_of[hca_id]) for link_id, host_id, hca_id in cables}


UP_STATES = [state for state in Link.State.values if state != Link.State.DOWN]


def cut_off_hosts_query():
    """Hosts cut off from the fabric, as a subquery (`.filter(host__in=...)`): a cable of theirs
    is down (an open `down` fault) and none of their HCA cables is up. A host with no cable
    IBEX knows is never cut off."""
    return (Host.objects.filter(hcas__port_set__link__faults__kind=LinkFault.Kind.DOWN,
                                hcas__port_set__link__faults__ended_at__isnull=True)
            .exclude(hcas__port_set__link__state__in=UP_STATES).values("pk"))


def cut_off_hosts() -> set[int]:
    return set(cut_off_hosts_query().values_list("pk", flat=True))


HEALTH_CACHE_S = 300  # a stale picture is never served: its key names the report it follows
# this process's own keys: a database restored or recreated (tests) reuses fabric ids and times
HEALTH_EPOCH = uuid.uuid4().hex[:12]


def fabric_health(fabric: Fabric) -> dict:
    """The provider's live picture: per tier (host-leaf, leaf-spine, ...) the links, those down
    and erring, errors per minute and utilisation, from the stored counters; and the open
    faults by name. Computed once per agent report (0.75 s at 1,920 hosts), however many
    pages and clients ask: only a report or a new error threshold changes it."""
    if fabric.agent_seen_at is None:
        return _fabric_health(fabric)
    key = (f"fabric-health:{HEALTH_EPOCH}:{fabric.pk}:{fabric.agent_seen_at.isoformat()}:"
           f"{fabric.error_threshold}")
    found = cache.get(key)
    if found is None:
        found = _fabric_health(fabric)
        cache.set(key, found, HEALTH_CACHE_S)
    return found


def _fabric_health(fabric: Fabric) -> dict:
    ends: dict[int, list] = defaultdict(list)
    for port in Port.objects.filter(fabric=fabric, link__isnull=False).select_related(
            "counters", "link", "switch"):
        ends[port.link_id].append(port)
    readings = []
    for ports in ends.values():
        if len(ports) != 2:
            continue
        link = ports[0].link
        tiers = [port.switch.tier if port.switch_id else "host" for port in ports]
        samples = tuple(_sample(p.counters) for p in ports if getattr(p, "counters", None))
        readings.append(bandwidth.LinkReading(
            tier=bandwidth.tier_of_link(*tiers), state=link.state,
            rate_gbps=float(link.rate_gbps) if link.rate_gbps is not None else None,
            ends=samples))
    tiers = bandwidth.tiers(readings, fabric.error_threshold)
    faults = list(LinkFault.objects.filter(fabric=fabric, ended_at__isnull=True)
                  .order_by("started_at", "id").values("kind", "name", "detail", "started_at"))
    return {
        "sampled_at": fabric.live_seen_at, "error_threshold": fabric.error_threshold,
        "tiers": [{"tier": t.tier, "links": t.links, "down": t.down, "erring": t.erring,
                   "errors_per_minute": round(t.errors_per_minute, 1),
                   "traffic_gbps": round(t.traffic_gbps, 3),
                   "capacity_gbps": round(t.capacity_gbps, 1),
                   "utilisation": None if t.utilisation is None else round(t.utilisation, 4)}
                  for t in tiers],
        "faults": faults,
    }
def route_map(fabric: Fabric) -> RouteMap | None:
    """The fabric's routes as the agent last read them, ready to trace (`RouteMap.path`), on
    IBEX's cables with their states and rates; None when no agent has sent routes. Four
    queries."""
    held = FabricRoutes.objects.filter(fabric=fabric).first()
    if held is None:
        return None
    route = RouteMap(lids=held.lids, tables={guid: decode_table(text)
                                             for guid, text in held.tables.items()},
                     peers={}, host_ports={})
    cabling(fabric, route)
    return route


def cabling(fabric: Fabric, route: RouteMap) -> RouteMap:
    """Fill `route`'s peers, down ports, rates, names and hosts' HCA ports from the fabric's
    links and ports."""
    ends: dict[int, list[tuple[str, int]]] = {}
    for link_id, guid, number in Port.objects.filter(fabric=fabric, link__isnull=False) \
            .values_list("link_id", "device_guid", "number"):
        ends.setdefault(link_id, []).append((guid, number))
    for link_id, state, rate in Link.objects.filter(fabric=fabric).values_list(
            "id", "state", "rate_gbps"):
        pair = ends.get(link_id, [])
        if len(pair) != 2:
            continue
        for here, there in (pair, pair[::-1]):
            route.peers[here] = there
            route.rates[here] = float(rate or fabric.link_rate_gbps or 0)
            if state != Link.State.ACTIVE:
                route.down.add(here)
    route.names.update(Switch.objects.filter(fabric=fabric).values_list("guid", "name"))
    by_host: dict[str, dict[tuple, tuple[str, int]]] = {}  # host -> rail order -> HCA's port
    for host, description, hca_guid, guid, number in Port.objects.filter(
            fabric=fabric, hca__isnull=False, link__isnull=False).order_by("number") \
            .values_list("hca__host__name", "hca__description", "hca__guid", "device_guid",
                         "number"):
        route.names.setdefault(guid, host)
        by_host.setdefault(host, {}).setdefault(
            partitions_core.rail_order(description, hca_guid), (guid, number))
    for host, ports in by_host.items():
        rails = [port for _order, port in sorted(ports.items())]
        route.host_ports[host] = rails[0]
        if len(rails) > 1:
            route.rail_ports[host] = rails
    return route


def lease_links(fabric: Fabric, hosts: list[str]) -> list[dict]:
    """The directed links on the routes of an all-reduce ring over `hosts` (rank order), for
    people and for checks: each with its sending port and name. Empty with no routes known."""
    route = route_map(fabric)
    if route is None:
        return []
    return [{"guid": guid, "port": port, "name": route.name((guid, port)),
             "rate_gbps": route.rates.get((guid, port))}
            for guid, port in sorted(route.ring_links(hosts))]


def admission_routes(fabric: Fabric) -> RouteMap:
    """The routes guarantees are checked on: the agent's (the switches' real tables) where it
    has sent them, else routes IBEX derives from its own topology (min-hop, spread by
    destination LID as OpenSM's ftree does), over the cables that are up."""
    real = route_map(fabric)
    if real is not None:
        return real
    seen = cabling(fabric, RouteMap(lids={}, tables={}, peers={}, host_ports={}))
    cables = sorted((here, there) for here, there in seen.peers.items() if here < there)
    switches = set(Switch.objects.filter(fabric=fabric).values_list("guid", flat=True))
    key = hash((tuple(cables), tuple(sorted(seen.down)), tuple(sorted(switches)),
                tuple(sorted(seen.host_ports.items())),
                tuple(sorted((host, tuple(ports)) for host, ports in seen.rail_ports.items())),
                tuple(sorted(seen.rates.items())), tuple(sorted(seen.names.items()))))
    held = _derived.get(fabric.pk)
    if held is not None and held[0] == key:
        return held[1]
    derived = derived_route_map(cables, seen.host_ports, switches, names=seen.names,
                                rates=seen.rates, down=seen.down, rail_ports=seen.rail_ports)
    _derived[fabric.pk] = (key, derived)
    return derived


# fabric id -> (its cabling's hash, the routes derived from it): deriving takes 0.1 s for
# 1,920 hosts of one HCA and 18 s for 15,360 HCAs on rails, and the cabling changes rarely. A
# RouteMap is never changed once built, so one is shared by every check until the cabling
# (cables, states, rates, names) changes.
_derived: dict[int, tuple[int, RouteMap]] = {}


def links_down_lately(fabric: Fabric, limit: int = 3) -> list[str]:
    """The fabric's links that are down, the latest to go first, named for people
    (``leaf01 port 5 - spine02 port 1``): what an event about a broken guarantee cites."""
    links = list(Link.objects.filter(fabric=fabric, state=Link.State.DOWN)
                 .order_by("-state_changed_at", "id").values_list("id", flat=True)[:limit])
    if not links:
        return []
    ends: dict[int, list[tuple[str, int]]] = {}
    for link_id, guid, number in Port.objects.filter(link_id__in=links) \
            .order_by("link_id", "link_end").values_list("link_id", "device_guid", "number"):
        ends.setdefault(link_id, []).append((guid, number))
    names = dict(Switch.objects.filter(fabric=fabric).values_list("guid", "name"))
    names.update(Hca.objects.filter(fabric=fabric).values_list("guid", "host__name"))
    return [" - ".join(f"{names.get(guid, guid)} port {number}" for guid, number in ends[link])
            for link in links if link in ends]

"""The routes between hosts, from the switches' unicast forwarding tables (pure, no Django).

A forwarding table maps a destination LID to the switch's out port. The agent reads every
switch's table (``dump_fts``) and sends them compactly: per switch one hex string, two digits a
LID from LID 0 (``ff``: no route), so 1,920 hosts cost 4 kB a switch. `RouteMap.path` traces the
directed links a packet from one host's HCA to another's crosses: out of the HCA to its leaf,
then at each switch the port its table gives for the destination's LID, until the destination
HCA. A directed link is named by its sending port, (GUID, port): one port sends on one cable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_ROUTE = 0xFF
MAX_HOPS = 64  # a table that loops is a broken route, not an endless walk

Port = tuple[str, int]  # (device GUID, port number): a directed link by its sending end


def encode_table(table: dict[int, int]) -> str:
    """{LID: out port} -> two hex digits a LID from LID 0, ``ff`` where none."""
    if not table:
        return ""
    ports = bytearray([NO_ROUTE]) * (max(table) + 1)
    for lid, port in table.items():
        ports[lid] = port
    return ports.hex()


def decode_table(text: str) -> bytes:
    return bytes.fromhex(text)


class RouteBroken(Exception):
    """The tables lead nowhere (no entry, a loop) or over a link that is down."""

    def __init__(self, at: Port | None, why: str):
        super().__init__(why)
        self.at, self.why = at, why


@dataclass
class RouteMap:
    """What tracing needs: LIDs, tables, the cables (each port's peer) and each host's HCA port.

    `down` holds the sending ports of cables that are not up: a route over one is broken."""

    lids: dict[str, int]  # node GUID -> LID
    tables: dict[str, bytes]  # switch GUID -> out port per LID
    peers: dict[Port, Port]  # each cabled port -> the port at the cable's other end
    host_ports: dict[str, Port]  # host name -> its first HCA's cabled port
    down: set[Port] = field(default_factory=set)
    names: dict[str, str] = field(default_factory=dict)  # GUID -> switch or host name
    rates: dict[Port, float] = field(default_factory=dict)  # sending port -> the cable's Gb/s
    # host name -> its HCAs' cabled ports in rail order, where it has several (rail 0 is its
    # `host_ports` entry); a host not here has one rail
    rail_ports: dict[str, list[Port]] = field(default_factory=dict)
    # traced paths, by (source, destination): a RouteMap is not changed once built
    _paths: dict = field(default_factory=dict, repr=False)

    def path(self, source: str, destination: str, source_rail: int = 0,
             destination_rail: int = 0) -> list[Port]:
        """The directed links (sending ports) from `source`'s HCA on `source_rail` to
        `destination`'s on `destination_rail`, in order; RouteBroken when the tables do not
        lead there over links that are up."""
        key = (source, destination, source_rail, destination_rail)
        found = self._paths.get(key)
        if found is None:
            try:
                found = self._trace(self.port_of(source, source_rail),
                                    self.port_of(destination, destination_rail), destination)
            except RouteBroken as broken:
                found = broken
            self._paths[key] = found
        if isinstance(found, RouteBroken):
            raise found
        return found

    def port_of(self, host: str, rail: int = 0) -> Port:
        """The cabled port of `host`'s HCA on `rail` (its first HCA where it has no such rail)."""
        rails = self.rail_ports.get(host)
        if rails and 0 <= rail < len(rails):
            return rails[rail]
        return self.host_ports[host]

    def rails_of(self, host: str) -> int:
        return len(self.rail_ports.get(host) or ()) or 1

    def _trace(self, start: Port, end: Port, destination: str) -> list[Port]:
        source = self.names.get(start[0], start[0])
        target = end[0]
        lid = self.lids.get(target)
        if lid is None:
            raise RouteBroken(None, f"{destination} has no LID")
        hops, here = [], start
        for _hop in range(MAX_HOPS):
            if here in self.down:
                raise RouteBroken(here, f"{self.name(here)} is down")
            hops.append(here)
            peer = self.peers.get(here)
            if peer is None:
                raise RouteBroken(here, f"{self.name(here)} leads nowhere")
            if peer[0] == target:
                return hops
            table = self.tables.get(peer[0], b"")
            out = table[lid] if lid < len(table) else NO_ROUTE
            if out in (NO_ROUTE, 0):
                raise RouteBroken(here, f"{self.names.get(peer[0], peer[0])} has no route "
                                        f"to {destination}")
            here = (peer[0], out)
        raise RouteBroken(here, f"the route from {source} to {destination} loops")

    def name(self, port: Port) -> str:
        """``leaf03 port 17 → spine02``: the sending device, its port, the receiving device."""
        peer = self.peers.get(port)
        to = self.names.get(peer[0], peer[0]) if peer else "?"
        return f"{self.names.get(port[0], port[0])} port {port[1]} → {to}"

    def ring(self, hosts: list[str]) -> list[tuple[str, str]]:
        """The hops of an all-reduce ring over `hosts` in rank order: each sends to the next,
        the last to the first. One host: none."""
        if len(hosts) < 2:
            return []
        return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]

    def ring_links(self, hosts: list[str]) -> set[Port]:
        """Every directed link on the ring's routes (RouteBroken where one is broken)."""
        return {port for a, b in self.ring(hosts) for port in self.path(a, b)}


def derived_route_map(cables: list[tuple[Port, Port]], host_ports: dict[str, Port],
                      switches: set[str], *, names: dict[str, str] | None = None,
                      rates: dict[Port, float] | None = None,
                      down: set[Port] | None = None,
                      rail_ports: dict[str, list[Port]] | None = None) -> RouteMap:
    """Routes IBEX derives from its own topology when no agent has sent the real ones:
    min-hop, spread over equal next hops by destination LID (D-mod-K, as OpenSM's ftree and
    minhop engines spread them). Each host's HCA ports get LIDs (1, 2, ... by host name, then
    rail); every switch gets a table toward every HCA over cables that are up."""
    down = down or set()
    rail_ports = rail_ports or {}
    peers: dict[Port, Port] = {}
    for here, there in cables:
        peers[here], peers[there] = there, here
    ends = [port for host in sorted(host_ports)
            for port in (rail_ports.get(host) or [host_ports[host]])]
    lids = {guid: lid for lid, (guid, _port) in enumerate(ends, start=1)}
    neighbours: dict[str, list[tuple[int, str]]] = {guid: [] for guid in switches}
    for (guid, port), (peer, _) in peers.items():
        if guid in switches and peer in switches and (guid, port) not in down:
            neighbours[guid].append((port, peer))
    tables = {guid: bytearray([NO_ROUTE]) * (len(lids) + 1) for guid in switches}
    by_leaf: dict[str, list[tuple[int, int]]] = {}
    for guid, port in ends:
        leaf_port = peers.get((guid, port))
        if leaf_port is not None and leaf_port[0] in switches:
            by_leaf.setdefault(leaf_port[0], []).append((lids[guid], leaf_port[1]))
    for leaf, destinations in by_leaf.items():
        _route_toward(leaf, destinations, neighbours, tables)
    return RouteMap(lids=lids, tables={guid: bytes(table) for guid, table in tables.items()},
                    peers=peers, host_ports=dict(host_ports), down=set(down),
                    names=dict(names or {}), rates=dict(rates or {}),
                    rail_ports={host: list(ports) for host, ports in rail_ports.items()})


def _route_toward(leaf: str, destinations: list[tuple[int, int]],
                  neighbours: dict[str, list[tuple[int, str]]], tables: dict) -> None:
    """Fill every switch's entries for the hosts under `leaf`: the leaf sends to the host's
    port; any other switch to a neighbour one hop nearer the leaf, the LID choosing which."""
    distance = {leaf: 0}
    frontier = [leaf]
    while frontier:
        following = []
        for guid in frontier:
            for _port, peer in neighbours[guid]:
                if peer not in distance:
                    distance[peer] = distance[guid] + 1
                    following.append(peer)
        frontier = following
    for guid, hops in distance.items():
        table = tables[guid]
        if guid == leaf:
            for lid, port in destinations:
                table[lid] = port
            continue
        nearer = sorted(port for port, peer in neighbours[guid]
                        if distance.get(peer, hops) == hops - 1)
        for lid, _port in destinations:
            table[lid] = nearer[lid % len(nearer)]

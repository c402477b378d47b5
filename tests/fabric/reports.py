"""Small factories for fabric agent reports: what `ibex-agent fabric` would send for a fabric
spec, with chosen cables missing."""

from __future__ import annotations

from datetime import datetime

from fabric.core.diags import Discovery, LiveLink, LiveNode, link_key
from fabric.core.fabric_report import (
    REPORT_VERSION,
    counters_entry,
    topology_hash,
    topology_section,
)
from fabric.core.spec import FabricSpec


def discovery_of(spec: FabricSpec, without: set = frozenset()) -> Discovery:
    """The spec as ibnetdiscover would read it, less the cables whose keys are in `without`."""
    nodes = {s.guid: LiveNode(s.guid, "switch", max(s.ports, 1), s.name, 1 + i)
             for i, s in enumerate(spec.switches)}
    nodes.update({h.guid: LiveNode(h.guid, "ca", 1, h.description, 1000 + i)
                  for i, h in enumerate(spec.hcas)})
    links = [LiveLink(*key_of(link)[0], *key_of(link)[1], link.rate_gbps, "4x")
             for link in spec.links if key_of(link) not in without]
    return Discovery(nodes=nodes, links=links)


def key_of(link) -> tuple:
    return link_key(link.a_guid, link.a_port, link.b_guid, link.b_port)


def report(spec: FabricSpec, observed_at: datetime, *, without: set = frozenset(),
           topology: bool = True, counters: dict | None = None) -> dict:
    """A reachable poll; `counters` maps (guid, port) to the counters to report there."""
    section = topology_section(discovery_of(spec, without))
    body = {"version": REPORT_VERSION, "observed_at": observed_at.isoformat(), "reachable": True,
            "error": "", "topology_hash": topology_hash(section), "poll_s": 0.5}
    if topology:
        body.update(section)
    if counters is not None:
        body["counters"] = [counters_entry(guid, port, values)
                            for (guid, port), values in counters.items()]
    return body


def unreachable(observed_at: datetime, error: str = "ibnetdiscover gave no answer within 5 s"):
    return {"version": REPORT_VERSION, "observed_at": observed_at.isoformat(),
            "reachable": False, "error": error}

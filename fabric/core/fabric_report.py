"""The fabric agent's report (version 1): what it saw of the fabric in one poll.

Shared by the agent, which builds it, and the server, which reads it (docs/fabric.md has the
format). Each section is optional beside the header, so later sections (partitions, QoS, routes)
are added without a new version:

- header: ``version``, ``observed_at`` (the agent's clock when the poll started), ``reachable``,
  ``error`` (why not), ``poll_s``, ``topology_hash``;
- ``nodes`` and ``links``: the whole topology as a snapshot, sent when its hash differs from the
  hash the server last acknowledged (so the first report, and after every change);
- ``counters``: every cabled port's counters, every poll (they change every poll);
- ``subnet_manager``: what the agent knows of OpenSM (its pid file, its config directory);
- ``routes`` (with ``routes_hash``): every node's LID and every switch's forwarding table, a
  snapshot sent when its hash differs from the one the server last acknowledged.
"""

from __future__ import annotations

import hashlib
import json

from fabric.core.diags import COUNTER_FIELDS, Discovery, link_state
from fabric.core.routes import encode_table

REPORT_VERSION = 1


def topology_section(discovery: Discovery, states: dict | None = None) -> dict:
    """The ``nodes`` and ``links`` of a report, in a stable order; each link's state from the
    ports' `states` (`fabric.core.diags.parse_linkinfo`), `active` where none is known."""
    nodes = [
        {"guid": node.guid, "kind": node.kind, "ports": node.ports,
         "description": node.description, "lid": node.lid}
        for node in sorted(discovery.nodes.values(), key=lambda n: n.guid)
    ]
    links = [
        {"a": {"guid": link.a_guid, "port": link.a_port},
         "b": {"guid": link.b_guid, "port": link.b_port},
         "state": link_state(states or {}, link), "rate_gbps": link.rate_gbps,
         "width": link.width or ""}
        for link in discovery.links
    ]
    return {"nodes": nodes, "links": links}


def topology_hash(section: dict) -> str:
    """A digest of a topology section: equal hashes, equal nodes, LIDs, cables and rates."""
    text = json.dumps(section, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def counters_entry(guid: str, port: int, counters: dict) -> dict:
    entry = {"guid": guid, "port": port, "extended": bool(counters.get("extended"))}
    entry.update({name: int(counters.get(name, 0)) for name in COUNTER_FIELDS})
    return entry


def routes_section(tables: dict[str, dict[int, int]], lids: dict[str, int]) -> dict:
    """The ``routes`` of a report: every node's LID and every switch's forwarding table as a
    hex string (`fabric.core.routes.encode_table`), in a stable order."""
    return {"lids": {guid: lids[guid] for guid in sorted(lids) if lids[guid]},
            "switches": {guid: encode_table(tables[guid]) for guid in sorted(tables)}}


def routes_hash(section: dict) -> str:
    return topology_hash(section)

"""TopologySnapshot: an immutable in-memory view of one fabric for placement and simulation.

Nodes and domains get integer ids; per-node lists of leaf and spine ids make the hop and
common-level questions two list lookups and a comparison. Batch forms on numpy arrays
(``hops_ids``, ``common_level_ids``) serve large scans.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from fabric.core.hostlist import natural_key, natural_sorted
from fabric.core.levels import FabricLevels, analyse
from fabric.core.locality import LEVEL_RANK, LEVELS
from fabric.core.spec import Coords, FabricSpec

# Links crossed between two nodes whose lowest common level is node / leaf / spine / fabric.
_TREE_HOPS = (0, 2, 4, 6)  # node-leaf-node, node-leaf-spine-leaf-node, ... via a core
_DRAGONFLY_HOPS = (0, 2, 3, 5)  # same router; one local hop; local + global + local (minimal)


class SnapshotNode(NamedTuple):
    host: str
    leaf: str
    spine: str
    gpus: int
    coords: Coords | None = None  # torus: the router position


class TopologySnapshot:
    """Build with ``from_spec`` or ``from_domains``; never mutated afterwards."""

    __slots__ = (
        "name", "kind", "torus_dims", "nodes", "_index", "_key", "_leaf_of", "_spine_of",
        "_leaf_names", "_spine_names", "_leaf_index", "_spine_index", "_leaf_members",
        "_spine_members", "_gpus", "_coords", "_hop_table", "_leaf_array", "_spine_array",
        "_coord_array", "_host_gbps", "_leaf_host_gbps", "_spine_host_gbps",
        "_leaf_uplink_gbps", "_spine_uplink_gbps", "_frozen",
    )

    def __init__(
        self,
        nodes: Iterable[SnapshotNode | tuple],
        *,
        kind: str = "fat-tree",
        name: str = "fabric",
        torus_dims: Coords | None = None,
        host_gbps: float | Mapping[str, float] | None = None,
        leaf_uplink_gbps: Mapping[str, float] | None = None,
        spine_uplink_gbps: Mapping[str, float] | None = None,
    ) -> None:
        rows = sorted((SnapshotNode(*row) for row in nodes), key=lambda r: natural_key(r.host))
        if len({r.host for r in rows}) != len(rows):
            raise ValueError("a node appears twice")
        if kind == "torus" and (torus_dims is None or any(r.coords is None for r in rows)):
            raise ValueError("a torus snapshot needs torus_dims and coords for every node")
        self.name, self.kind, self.torus_dims = name, kind, torus_dims
        self.nodes: tuple[str, ...] = tuple(r.host for r in rows)
        self._index = {host: i for i, host in enumerate(self.nodes)}
        self._leaf_names = tuple(natural_sorted({r.leaf for r in rows}))
        self._spine_names = tuple(natural_sorted({r.spine for r in rows}))
        self._leaf_index = {n: i for i, n in enumerate(self._leaf_names)}
        self._spine_index = {n: i for i, n in enumerate(self._spine_names)}
        self._leaf_of = [self._leaf_index[r.leaf] for r in rows]
        self._spine_of = [self._spine_index[r.spine] for r in rows]
        # One tuple per node, fetched with a single dict lookup on the hot path.
        self._key = {r.host: (i, self._leaf_of[i], self._spine_of[i]) for i, r in enumerate(rows)}
        self._leaf_members = _members(self._leaf_of, len(self._leaf_names), self.nodes)
        self._spine_members = _members(self._spine_of, len(self._spine_names), self.nodes)
        self._gpus = tuple(int(r.gpus) for r in rows)
        self._coords = tuple(r.coords for r in rows)
        self._hop_table = _DRAGONFLY_HOPS if kind == "dragonfly" else _TREE_HOPS
        self._leaf_array = np.asarray(self._leaf_of, dtype=np.int32)
        self._spine_array = np.asarray(self._spine_of, dtype=np.int32)
        self._coord_array = (
            np.asarray(self._coords, dtype=np.int32) if kind == "torus" else None
        )
        self._set_bandwidth(host_gbps, leaf_uplink_gbps, spine_uplink_gbps)
        self._frozen = True

    def __setattr__(self, attribute, value):
        if getattr(self, "_frozen", False):
            raise AttributeError("TopologySnapshot is immutable")
        object.__setattr__(self, attribute, value)

    # --- construction -------------------------------------------------------------------

    @classmethod
    def from_domains(cls, nodes: Iterable[SnapshotNode | tuple], **options) -> TopologySnapshot:
        """From rows ``(host, leaf, spine, gpus[, coords])``, e.g. read from the database.

        Options: ``kind``, ``name``, ``torus_dims``, ``host_gbps`` (one rate or per host),
        ``leaf_uplink_gbps`` / ``spine_uplink_gbps`` (bandwidth leaving each domain).
        """
        return cls(nodes, **options)

    @classmethod
    def from_spec(cls, spec: FabricSpec, name: str = "fabric") -> TopologySnapshot:
        levels = analyse(spec)
        host_gbps, leaf_up, spine_up = bandwidth_inputs(spec, levels)
        rows = [
            SnapshotNode(host, d.leaf, d.spine, spec.gpus_of(host), d.coords)
            for host, d in levels.nodes.items()
        ]
        return cls(rows, kind=spec.kind, name=name, torus_dims=spec.torus_dims,
                   host_gbps=host_gbps, leaf_uplink_gbps=leaf_up, spine_uplink_gbps=spine_up)

    def _set_bandwidth(self, host_gbps, leaf_uplink_gbps, spine_uplink_gbps) -> None:
        if host_gbps is None:
            self._host_gbps = None
            return
        if isinstance(host_gbps, Mapping):
            per_node = [float(host_gbps.get(host, 0.0)) for host in self.nodes]
        else:
            per_node = [float(host_gbps)] * len(self.nodes)
        self._host_gbps = tuple(per_node)
        self._leaf_host_gbps = _sums(self._leaf_of, len(self._leaf_names), per_node)
        self._spine_host_gbps = _sums(self._spine_of, len(self._spine_names), per_node)
        leaf_up, spine_up = leaf_uplink_gbps or {}, spine_uplink_gbps or {}
        self._leaf_uplink_gbps = tuple(float(leaf_up.get(n, 0.0)) for n in self._leaf_names)
        self._spine_uplink_gbps = tuple(float(spine_up.get(n, 0.0)) for n in self._spine_names)

    # --- questions ----------------------------------------------------------------------

    def node_id(self, node: str) -> int:
        return self._index[node]

    def gpus_of(self, node: str) -> int:
        return self._gpus[self._index[node]]

    def domain_of(self, node: str, level: str) -> str:
        i = self._index[node]
        if level == "node":
            return node
        if level == "leaf":
            return self._leaf_names[self._leaf_of[i]]
        if level == "spine":
            return self._spine_names[self._spine_of[i]]
        if level == "fabric":
            return self.name
        raise ValueError(f"unknown level {level!r}")

    def domains(self, level: str) -> tuple[str, ...]:
        return {"node": self.nodes, "leaf": self._leaf_names, "spine": self._spine_names,
                "fabric": (self.name,)}[level]

    def nodes_in(self, level: str, domain: str) -> tuple[str, ...]:
        if level == "node":
            return (domain,) if domain in self._index else ()
        if level == "leaf":
            return self._leaf_members[self._leaf_index[domain]]
        if level == "spine":
            return self._spine_members[self._spine_index[domain]]
        if level == "fabric":
            return self.nodes if domain == self.name else ()
        raise ValueError(f"unknown level {level!r}")

    def common_rank(self, a: str, b: str) -> int:
        """0 node, 1 leaf, 2 spine, 3 fabric: the lowest level holding both nodes."""
        ka, kb = self._key[a], self._key[b]
        if ka[0] == kb[0]:
            return 0
        if ka[1] == kb[1]:
            return 1
        if ka[2] == kb[2]:
            return 2
        return 3

    def lowest_common_level(self, a: str, b: str) -> str:
        return LEVELS[self.common_rank(a, b)]

    def hops(self, a: str, b: str) -> int:
        """Links on the shortest path: tree levels, or wrap-around router hops on a torus."""
        ka, kb = self._key[a], self._key[b]
        if ka[0] == kb[0]:
            return 0
        if self._coord_array is not None:
            return 2 + self._torus_distance(self._coords[ka[0]], self._coords[kb[0]])
        if ka[1] == kb[1]:
            return self._hop_table[1]
        if ka[2] == kb[2]:
            return self._hop_table[2]
        return self._hop_table[3]

    def _torus_distance(self, first: Coords, second: Coords) -> int:
        total = 0
        for p, q, size in zip(first, second, self.torus_dims, strict=True):
            step = abs(p - q)
            total += min(step, size - step)
        return total

    def hops_many(self, pairs: Iterable[tuple[str, str]]) -> list[int]:
        pairs = list(pairs)
        index = self._index
        a = np.fromiter((index[p[0]] for p in pairs), dtype=np.int64, count=len(pairs))
        b = np.fromiter((index[p[1]] for p in pairs), dtype=np.int64, count=len(pairs))
        return self.hops_ids(a, b).tolist()

    def common_level_ids(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Vectorised ``common_rank`` over node-id arrays."""
        same_node = a == b
        same_leaf = self._leaf_array[a] == self._leaf_array[b]
        same_spine = self._spine_array[a] == self._spine_array[b]
        return np.where(same_node, 0, np.where(same_leaf, 1, np.where(same_spine, 2, 3)))

    def hops_ids(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Vectorised ``hops`` over node-id arrays."""
        if self._coord_array is None:
            return np.asarray(self._hop_table)[self.common_level_ids(a, b)]
        step = np.abs(self._coord_array[a] - self._coord_array[b])
        dims = np.asarray(self.torus_dims)
        distance = np.minimum(step, dims - step).sum(axis=1)
        return np.where(a == b, 0, 2 + distance)

    # --- bandwidth ----------------------------------------------------------------------

    def _resolve(self, domain: str | tuple[str, str]) -> tuple[int, int]:
        """A domain as (level rank, id); a bare name is looked up leaf, spine, node, fabric."""
        if isinstance(domain, tuple):
            level, name = domain
            candidates = [level]
        else:
            name, candidates = domain, ["leaf", "spine", "node", "fabric"]
        tables = {"node": self._index, "leaf": self._leaf_index, "spine": self._spine_index,
                  "fabric": {self.name: 0}}
        for level in candidates:
            if name in tables[level]:
                return LEVEL_RANK[level], tables[level][name]
        raise KeyError(f"no domain {domain!r}")

    def _parent(self, rank: int, ident: int) -> tuple[int, int]:
        if rank == 0:
            return 1, self._leaf_of[ident]
        if rank == 1:
            return 2, self._spine_of[self._index[self._leaf_members[ident][0]]]
        return 3, 0

    def _chain(self, rank: int, ident: int) -> list[tuple[int, int]]:
        chain = [(rank, ident)]
        while chain[-1][0] < 3:
            chain.append(self._parent(*chain[-1]))
        return chain

    def _egress(self, rank: int, ident: int) -> float:
        """Bandwidth that can leave a domain: its hosts' links, capped by its uplinks."""
        if rank == 0:
            return self._host_gbps[ident]
        if rank == 1:
            return min(self._leaf_host_gbps[ident], self._leaf_uplink_gbps[ident])
        if rank == 2:
            return min(self._spine_host_gbps[ident], self._spine_uplink_gbps[ident])
        return sum(self._host_gbps)

    def bandwidth_between(
        self, domain_a: str | tuple[str, str], domain_b: str | tuple[str, str]
    ) -> float | None:
        """Estimated Gb/s from one domain to another (None without link rates).

        Traffic climbs from each domain to their lowest common ancestor; the estimate is the
        smallest egress (host links capped by uplinks, i.e. oversubscription) on the way. For
        nested domains it is the egress of the inner one's host links.
        """
        if self._host_gbps is None:
            return None
        chain_a = self._chain(*self._resolve(domain_a))
        chain_b = self._chain(*self._resolve(domain_b))
        if chain_a[0] in chain_b or chain_b[0] in chain_a:  # equal or nested
            inner = chain_a[0] if chain_a[0][0] <= chain_b[0][0] else chain_b[0]
            return self._host_bandwidth(*inner)
        common = next(d for d in chain_a if d in chain_b)
        below = chain_a[: chain_a.index(common)] + chain_b[: chain_b.index(common)]
        return min(self._egress(*d) for d in below)

    def _host_bandwidth(self, rank: int, ident: int) -> float:
        tables = (self._host_gbps, self._leaf_host_gbps, self._spine_host_gbps)
        return tables[rank][ident] if rank < 3 else sum(self._host_gbps)


def _members(domain_of: list[int], count: int, nodes: tuple[str, ...]) -> tuple:
    members: list[list[str]] = [[] for _ in range(count)]
    for node, domain in zip(nodes, domain_of, strict=True):
        members[domain].append(node)
    return tuple(tuple(m) for m in members)


def _sums(domain_of: list[int], count: int, values: list[float]) -> tuple[float, ...]:
    sums = [0.0] * count
    for domain, value in zip(domain_of, values, strict=True):
        sums[domain] += value
    return tuple(sums)


def _add_leaving(totals: dict[str, float], domain_of: dict[str, str], a: str, b: str,
                 rate: float) -> None:
    """Credit a switch-to-switch link to each domain it leaves."""
    da, db = domain_of.get(a), domain_of.get(b)
    if da == db:
        return
    if da is not None:
        totals[da] = totals.get(da, 0.0) + rate
    if db is not None:
        totals[db] = totals.get(db, 0.0) + rate


def bandwidth_inputs(
    spec: FabricSpec, levels: FabricLevels
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per host, its HCA bandwidth; per leaf and spine domain, the bandwidth leaving it.

    Kept beside the snapshot so that the database can store these three maps at import and
    rebuild the same snapshot with ``from_domains``.
    """
    host_of = {hca.guid: hca.host for hca in spec.hcas}
    host_gbps: dict[str, float] = {}
    leaf_up: dict[str, float] = {}
    spine_up: dict[str, float] = {}
    for link in spec.links:
        rate = link.rate_gbps or 0.0
        host = host_of.get(link.a_guid) or host_of.get(link.b_guid)
        if host is not None:
            host_gbps[host] = host_gbps.get(host, 0.0) + rate
            continue
        _add_leaving(leaf_up, levels.switch_leaf, link.a_guid, link.b_guid, rate)
        _add_leaving(spine_up, levels.switch_spine, link.a_guid, link.b_guid, rate)
    return host_gbps, leaf_up, spine_up

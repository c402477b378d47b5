"""Admission of guaranteed bandwidth on the real routes (pure, no Django): docs/fabric.md,
"Admission on the real routes".

**The model.** A guaranteed lease's traffic is its all-reduce, modelled as a ring over its
nodes in rank order: node i sends to node i+1, the last to the first (a lease on one node
crosses no cable). Each hop carries `gbps_per_gpu` × the lease's GPUs on the sending node: in
a ring (NCCL's, with one channel per GPU) every GPU of a node pushes its share across the
node's boundary, so a node's outbound traffic grows with its GPUs. A hop's flow crosses every
directed link of the route the forwarding tables give from the sender's HCA to the
receiver's; a directed link is its sending port (`fabric.core.routes.Port`).

**Rails.** On a host with one HCA per rail, GPU i sends through the HCA of its rail (i × HCAs
// GPUs, as the node agent gives `NCCL_IB_HCA`), and NCCL pairs rails across nodes: a hop's
share from the sender's rail r goes to the receiver's HCA on rail r where the lease holds a
GPU of that rail there, else to the receiver's rails it does not share with the sender, in
turn. A host whose rails are not known sends and receives on its first HCA.

**The check.** On every directed link, the sum of the guarantees crossing it (live leases,
plus the new one) stays within its rate × the provider's `guarantee_ratio`. The **headroom**
of a placement is the least slack left on any link it crosses (the rate share that stays
free); a placement that crosses no cable has unbounded headroom. A refusal names the most
overfilled link, `leaf03 port 17 → spine02`, and the figures.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from fabric.core.routes import Port, RouteBroken, RouteMap

DEFAULT_GUARANTEE_RATIO = 0.8


@dataclass(frozen=True)
class Guarantee:
    """A guaranteed lease as admission sees it: its hosts in rank order, its GPUs on each."""

    reference: str
    hosts: tuple[str, ...]
    gpus: tuple[int, ...]
    gbps_per_gpu: float
    # per host (in `hosts` order) the rail of each of its GPUs; () for a host of one rail
    rails: tuple[tuple[int, ...], ...] = ()

    def rails_on(self, position: int) -> tuple[int, ...]:
        return self.rails[position] if position < len(self.rails) else ()


@dataclass(frozen=True)
class Verdict:
    ok: bool
    headroom: float  # Gb/s left on the tightest link (negative: overfilled); inf: no cable
    link: Port | None = None  # the saturated (or broken) link
    reason: str = ""


Flow = tuple[str, int, str, int, float]  # sender, its rail, receiver, its rail, Gb/s


def ring_flows(guarantee: Guarantee) -> list[Flow]:
    """Each hop of the lease's ring, split by the sender's rails."""
    hosts = guarantee.hosts
    if len(hosts) < 2:
        return []
    flows = []
    for i, sender in enumerate(hosts):
        following = (i + 1) % len(hosts)
        sending = guarantee.rails_on(i) or (0,) * guarantee.gpus[i]
        for rail, to, gpus in rail_pairs(sending, guarantee.rails_on(following)):
            flows.append((sender, rail, hosts[following], to, guarantee.gbps_per_gpu * gpus))
    return flows


def rail_pairs(sending: tuple[int, ...], receiving: tuple[int, ...]
               ) -> list[tuple[int, int, int]]:
    """(sender's rail, receiver's rail, GPUs) for one hop: rail to the same rail where the
    receiver holds it, the rest in turn to the receiver's rails the sender does not hold."""
    counts: dict[int, int] = defaultdict(int)
    for rail in sending:
        counts[rail] += 1
    theirs = sorted(set(receiving)) or [0]
    spare = [rail for rail in theirs if rail not in counts] or theirs
    pairs, turn = [], 0
    for rail in sorted(counts):
        if rail in theirs:
            pairs.append((rail, rail, counts[rail]))
        else:
            pairs.append((rail, spare[turn % len(spare)], counts[rail]))
            turn += 1
    return pairs


def flows_on_links(route: RouteMap, guarantee: Guarantee) -> dict[Port, float]:
    """The Gb/s the lease puts on each directed link of its routes (RouteBroken: a route of
    its ring is broken)."""
    load: dict[Port, float] = defaultdict(float)
    for sender, rail, receiver, to, gbps in ring_flows(guarantee):
        for port in route.path(sender, receiver, rail, to):
            load[port] += gbps
    return load


def link_loads(route: RouteMap, guarantees: list[Guarantee]) -> dict[Port, float]:
    """The sum of live guarantees on each directed link. A lease whose route is broken puts
    nothing where it cannot go (its re-check moves or credits it)."""
    loads: dict[Port, float] = defaultdict(float)
    for guarantee in guarantees:
        try:
            flows = flows_on_links(route, guarantee)
        except RouteBroken:
            continue
        for port, gbps in flows.items():
            loads[port] += gbps
    return loads


def check(route: RouteMap, loads: dict[Port, float], guarantee: Guarantee,
          ratio: float = DEFAULT_GUARANTEE_RATIO) -> Verdict:
    """Whether `guarantee` fits beside `loads` on its routes, and its headroom."""
    try:
        flows = flows_on_links(route, guarantee)
    except RouteBroken as broken:
        return Verdict(False, -math.inf, broken.at, f"no route: {broken.why}")
    headroom, tightest = math.inf, None
    for port, gbps in flows.items():
        slack = route.rates.get(port, 0.0) * ratio - loads.get(port, 0.0) - gbps
        if slack < headroom:
            headroom, tightest = slack, port
    if headroom >= -1e-9:
        return Verdict(True, headroom, tightest)
    return Verdict(False, headroom, tightest,
                   refusal(route, tightest, loads.get(tightest, 0.0), flows[tightest], ratio))


def refusal(route: RouteMap, port: Port, held: float, new: float, ratio: float) -> str:
    rate = route.rates.get(port, 0.0)
    return (f"{route.name(port)} would carry {_gbps(held + new)} Gb/s of guarantees "
            f"({_gbps(held)} held + {_gbps(new)} new), above its {_gbps(rate * ratio)} Gb/s "
            f"({_gbps(rate)} Gb/s × guarantee ratio {ratio:g})")


def _gbps(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def add(loads: dict[Port, float], route: RouteMap, guarantee: Guarantee) -> None:
    for port, gbps in flows_on_links(route, guarantee).items():
        loads[port] = loads.get(port, 0.0) + gbps


def best(route: RouteMap, loads: dict[Port, float], candidates: list[Guarantee],
         ratio: float = DEFAULT_GUARANTEE_RATIO) -> tuple[int | None, Verdict]:
    """Among candidate placements of one lease, the feasible one with the most headroom (the
    first on a tie: the engine's own choice comes first) as (its index, its verdict); with
    none feasible (None, the first candidate's refusal)."""
    chosen, verdict, first = None, None, None
    for index, candidate in enumerate(candidates):
        found = check(route, loads, candidate, ratio)
        first = first or found
        if found.ok and (verdict is None or found.headroom > verdict.headroom):
            chosen, verdict = index, found
    return chosen, verdict or first or Verdict(False, -math.inf, None, "no placement")


def recheck(route: RouteMap, guarantees: list[Guarantee],
            ratio: float = DEFAULT_GUARANTEE_RATIO) -> dict[str, Verdict]:
    """Admit the live leases again, oldest first, on `route` (new routes, links down): those
    that no longer fit beside the ones before them, each with the link that refuses it."""
    loads: dict[Port, float] = {}
    failed: dict[str, Verdict] = {}
    for guarantee in guarantees:
        verdict = check(route, loads, guarantee, ratio)
        if verdict.ok:
            add(loads, route, guarantee)
        else:
            failed[guarantee.reference] = verdict
    return failed

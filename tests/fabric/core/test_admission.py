"""Admission of guaranteed bandwidth on the routes: the ring model, the check per directed
link against rate × guarantee ratio, headroom, refusals naming the link, re-checks."""

import math
from dataclasses import replace

from fabric.core import admission
from fabric.core.admission import Guarantee
from fabric.core.generators import fat_tree
from fabric.core.partitions import rail_order
from fabric.core.routes import derived_route_map

SPEC = fat_tree(16, 8, rate_gbps=100)  # 4 leaves of 4 hosts under 4 spines


def route_of(spec=SPEC, down=frozenset()):
    switches = {s.guid for s in spec.switches}
    names = {s.guid: s.name for s in spec.switches}
    host_of = {hca.guid: hca.host for hca in spec.hcas}
    rail_of = {hca.guid: rail_order(hca.description, hca.guid) for hca in spec.hcas}
    cables, rails, rates = [], {}, {}
    for link in spec.links:
        a, b = (link.a_guid, link.a_port), (link.b_guid, link.b_port)
        cables.append((a, b))
        rates[a] = rates[b] = float(link.rate_gbps)
        for end in (a, b):
            if end[0] in host_of:
                rails.setdefault(host_of[end[0]], []).append(end)
                names[end[0]] = host_of[end[0]]
    rails = {host: sorted(ports, key=lambda port: rail_of[port[0]])
             for host, ports in rails.items()}
    hosts = {host: ports[0] for host, ports in rails.items()}
    return derived_route_map(cables, hosts, switches, names=names, rates=rates, down=set(down),
                             rail_ports={h: ports for h, ports in rails.items() if len(ports) > 1})


def lease(reference, hosts, gpus, gbps):
    return Guarantee(reference, tuple(hosts), tuple(gpus), float(gbps))


def test_a_ring_sends_each_nodes_gpus_times_the_guarantee_to_the_next_node_and_back_to_the_first():
    flows = admission.ring_flows(lease("L-1", ["a", "b", "c"], [8, 4, 2], 5))

    assert flows == [("a", 0, "b", 0, 40.0), ("b", 0, "c", 0, 20.0), ("c", 0, "a", 0, 10.0)]
    assert admission.ring_flows(lease("L-2", ["a"], [8], 5)) == []


def test_a_hop_pairs_each_rail_with_the_same_rail_and_the_rest_with_the_receivers_other_rails():
    assert admission.rail_pairs((0, 1, 2, 3), (0, 1, 2, 3)) == [
        (0, 0, 1), (1, 1, 1), (2, 2, 1), (3, 3, 1)]
    assert admission.rail_pairs((0, 0, 1, 1), (1, 1, 2, 2)) == [(0, 2, 2), (1, 1, 2)]
    assert admission.rail_pairs((4, 5), ()) == [(4, 0, 1), (5, 0, 1)]  # one HCA there
    assert admission.rail_pairs((), (0, 1)) == []


RAILS = fat_tree(8, 8, rate_gbps=100, rails=4)  # 2 units of 4 hosts, HCA i on rail i's leaf


def test_on_rail_optimised_hosts_each_gpu_sends_through_its_own_rails_hca():
    route = route_of(RAILS)
    two_nodes = Guarantee("L-1", ("node01", "node05"), (8, 8), 45.0,
                          rails=((0, 0, 1, 1, 2, 2, 3, 3),) * 2)

    flows = admission.flows_on_links(route, two_nodes)
    verdict = admission.check(route, {}, two_nodes)

    # 2 GPUs a rail × 45 Gb/s = 90 on each rail's cables, above 80: refused on a rail's cable
    leaving = {port for port in flows if route.names.get(port[0]) == "node01"}
    assert leaving == {route.port_of("node01", rail) for rail in range(4)}
    assert len({route.name(port).split(" → ")[1] for port in leaving}) == 4  # four leaves
    assert set(flows.values()) == {90.0}
    assert not verdict.ok and verdict.reason.startswith("node0")
    assert "(0 held + 90 new)" in verdict.reason
    # the first-HCA model would have put all 8 GPUs' 360 Gb/s on one cable
    one_rail = admission.check(route, {}, replace(two_nodes, rails=()))
    assert "(0 held + 360 new)" in one_rail.reason


def test_a_rail_optimised_lease_fits_what_one_hca_could_not_carry():
    route = route_of(RAILS)
    quarter = Guarantee("L-1", ("node01", "node05"), (8, 8), 40.0,
                        rails=((0, 0, 1, 1, 2, 2, 3, 3),) * 2)

    verdict = admission.check(route, {}, quarter)  # 80 Gb/s on each rail's cables: the limit

    assert verdict.ok and verdict.headroom == 0


def test_derived_routes_cross_a_spine_between_leaves_and_stay_in_the_leaf_within_one():
    route = route_of()

    across = [route.name(hop) for hop in route.path("node01", "node05")]
    within = route.path("node01", "node02")

    assert across[0] == "node01 port 1 → leaf01" and across[-1] == "leaf02 port 1 → node05"
    assert "→ spine" in across[1] and len(across) == 4
    assert len(within) == 2


def test_a_guarantee_that_would_overfill_an_uplink_is_refused_naming_the_uplink():
    route = route_of()
    loads = {}
    admission.add(loads, route, lease("L-1", ["node01", "node05"], [4, 4], 12))  # 48 a hop
    shared = route.path("node01", "node05")[1]
    other = next(h for h in ("node06", "node09", "node13", "node10", "node14")
                 if route.path("node02", h)[1] == shared)

    verdict = admission.check(route, loads, lease("L-2", ["node02", other], [4, 4], 12))

    assert not verdict.ok and verdict.link == shared
    assert route.name(shared).startswith("leaf01 port ") and "→ spine" in route.name(shared)
    assert verdict.reason == (f"{route.name(shared)} would carry 96 Gb/s of guarantees (48 held "
                              "+ 48 new), above its 80 Gb/s (100 Gb/s × guarantee ratio 0.8)")


def test_headroom_is_the_least_slack_on_the_route_and_a_single_node_has_no_limit():
    route = route_of()
    loads = {route.path("node01", "node05")[1]: 30.0}

    verdict = admission.check(route, loads, lease("L-1", ["node01", "node05"], [2, 2], 10))
    alone = admission.check(route, loads, lease("L-2", ["node01"], [8], 10))

    assert verdict.ok and verdict.headroom == 80 - 30 - 20
    assert alone.ok and alone.headroom == math.inf


def test_the_most_headroom_wins_among_feasible_candidates():
    route = route_of()
    loads = {route.path("node01", "node05")[1]: 70.0}
    candidates = [lease("L-1", ["node01", "node05"], [1, 1], 5),  # 5 beside 70: slack 5
                  lease("L-1", ["node01", "node02"], [1, 1], 5),  # within leaf01: slack 75
                  lease("L-1", ["node01", "node05"], [8, 8], 5)]  # 40 beside 70: refused

    index, verdict = admission.best(route, loads, candidates)

    assert index == 1 and verdict.headroom == 75


def test_with_no_feasible_candidate_the_first_refusal_is_given():
    route = route_of()
    loads = {route.path("node01", "node05")[1]: 79.0}

    index, verdict = admission.best(route, loads, [lease("L-1", ["node01", "node05"], [1, 1], 5)])

    assert index is None and not verdict.ok and "leaf01 port" in verdict.reason


def test_a_recheck_after_a_link_goes_down_keeps_the_oldest_and_names_why_the_others_fail():
    route = route_of()
    old = lease("L-1", ["node01", "node05"], [4, 4], 10)
    young = lease("L-2", ["node02", "node06"], [4, 4], 10)
    uplink = route.path("node01", "node05")[1]
    down = route_of(down={uplink, route.peers[uplink]})

    assert admission.recheck(route, [old, young]) == {}
    failed = admission.recheck(down, [old, young])

    # with the uplink down, the derived routes go around it; both fit on what is left
    assert failed == {}
    assert uplink not in down.path("node01", "node05")


def test_a_route_over_a_down_link_is_broken_and_named():
    before = route_of()
    uplink = before.path("node01", "node05")[1]
    route = replace(before, down={uplink}, _paths={})  # the tables not yet routed around it

    verdict = admission.check(route, {}, lease("L-1", ["node01", "node05"], [1, 1], 1))

    assert not verdict.ok and verdict.link == uplink and "is down" in verdict.reason

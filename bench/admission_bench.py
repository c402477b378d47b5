"""Admission of guaranteed bandwidth on the routes, with 10,000 live guaranteed leases.

    python bench/admission_bench.py [--leases 10000] [--checks 2000] [--seed 1] [--rails 8]

On the 1,920-host fat tree (60 leaves of 32 hosts under 32 spines, 100 Gb/s), with routes
derived from the topology (`fabric.core.routes.derived_route_map`, D-mod-K like OpenSM's
ftree: the same sizes as the agent's tables), it admits random guaranteed leases (1 to 8
nodes, mostly one, a GPU on each, 1 to 10 Gb/s per GPU) until `--leases` are live, then times:

- the routes: deriving them (done once per topology);
- the loads: the sum of guarantees per directed link over every live lease (what a placement
  reads before checking);
- one admission check (`admission.check`) of a new order, and choosing among 12 candidate
  placements (`admission.best`);
- a re-check of every live lease on the routes (`admission.recheck`, after a link goes down).

With `--rails N` the fat tree is rail-optimised (three tiers; each host's HCA i on rail i's
leaf of its unit) and each lease's GPU sits on a random rail: a hop's route starts and ends at
that rail's HCAs.

Pure Python, no Django, no database.
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fabric.core import admission  # noqa: E402
from fabric.core.generators import fat_tree  # noqa: E402
from fabric.core.partitions import rail_order  # noqa: E402
from fabric.core.routes import derived_route_map  # noqa: E402


def route_of(spec):
    switches = {s.guid for s in spec.switches}
    names = {s.guid: s.name for s in spec.switches}
    cables, rails, rates = [], {}, {}
    host_of = {hca.guid: hca.host for hca in spec.hcas}
    rail_of = {hca.guid: rail_order(hca.description, hca.guid) for hca in spec.hcas}
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
    return derived_route_map(cables, {host: ports[0] for host, ports in rails.items()},
                             switches, names=names, rates=rates,
                             rail_ports={h: ports for h, ports in rails.items() if len(ports) > 1})


def random_lease(rng, hosts, reference, free=None, rails=1):
    """1 to 8 nodes (mostly one), a GPU on each (on a random rail of `rails`): 10,000 leases
    take most of the 15,360 GPUs; on hosts with a GPU free when `free` is given."""
    nodes = rng.choices([1, 2, 4, 8], weights=[75, 18, 5, 2])[0]
    gpus = 1
    pool = [h for h in hosts if free[h] >= gpus] if free is not None else hosts
    chosen = tuple(rng.sample(pool, nodes))
    on_rails = tuple((rng.randrange(rails),) for _ in chosen) if rails > 1 else ()
    return admission.Guarantee(reference, chosen, (gpus,) * nodes, float(rng.randint(1, 10)),
                               on_rails)


def timed(function, repeat):
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - started)
    return result, times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--leases", type=int, default=10_000)
    parser.add_argument("--checks", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rails", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    spec = (fat_tree(1920, 64, rate_gbps=100) if args.rails == 1
            else fat_tree(1920, 64, rate_gbps=100, tiers=3, rails=args.rails))
    route, derive_s = timed(lambda: route_of(spec), 1)
    hosts = sorted(route.host_ports)
    print(f"fat tree: {len(hosts)} hosts, {len(spec.hcas)} HCAs, {len(spec.switches)} switches;"
          f" routes derived in {derive_s[0]:.2f} s")
    live, loads, refused = [], {}, 0
    free = dict.fromkeys(hosts, 8)
    while len(live) < args.leases:
        lease = random_lease(rng, hosts, f"L-{len(live)}", free, args.rails)
        if admission.check(route, loads, lease).ok:
            admission.add(loads, route, lease)
            live.append(lease)
            for host, gpus in zip(lease.hosts, lease.gpus, strict=True):
                free[host] -= gpus
        else:
            refused += 1
    print(f"{len(live)} live guaranteed leases ({sum(len(g.hosts) > 1 for g in live)} on "
          f"several nodes; {refused} refused on the way), {len(loads)} directed links loaded")
    loads, load_s = timed(lambda: admission.link_loads(route, live), 3)
    print(f"loads of every live lease: median {statistics.median(load_s) * 1e3:.0f} ms")
    orders = [random_lease(rng, hosts, "new", rails=args.rails) for _ in range(args.checks)]
    _, check_s = timed(lambda: [admission.check(route, loads, o) for o in orders], 1)
    per_check = check_s[0] / len(orders)
    print(f"one admission check: {per_check * 1e6:.0f} µs on average over {len(orders)} orders")
    groups = [orders[i:i + 12] for i in range(0, len(orders) - 11, 12)]
    _, best_s = timed(lambda: [admission.best(route, loads, g) for g in groups], 1)
    print(f"choosing among 12 candidates: {best_s[0] / len(groups) * 1e3:.2f} ms on average")
    _, recheck_s = timed(lambda: admission.recheck(route, live), 1)
    print(f"re-check of all {len(live)} live leases: {recheck_s[0] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()

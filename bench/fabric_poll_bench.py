"""One poll of the fabric agent on the largest fat tree ibsim holds, and the size of its report.

    python bench/fabric_poll_bench.py [--leaves 60] [--hosts-per-leaf 32] [--polls 3]
                                      [--counters auto|perfquery|ibqueryerrors]

Writes the fat tree (`fat_tree(leaves * hosts_per_leaf, radix=2 * hosts_per_leaf)`: 60 leaves of
32 hosts under 32 spines, 1,920 hosts and 92 switches, 2,012 of ibsim's 2,048 nodes) as an ibsim
net file, starts ibsim and OpenSM (routing engine ftree) in a scratch directory, and times:

- OpenSM: start to SUBNET UP;
- `ibnetdiscover` alone, and its parse;
- one whole poll (`FabricReader.read`: ibnetdiscover, then the counters of every cabled port:
  `perfquery` and `perfquery -x` on every node with a LID, four at a time, or two runs of
  `ibqueryerrors` over ibnetdiscover's cache; `auto` picks perfquery up to 256 nodes),
  `--polls` times;
- the routes: `dump_fts -n` (every switch's forwarding table in one run) against `ibroute LID`
  run once per switch, one after the other, and the poll's share of reading them;
- the report: JSON bytes with the topology (the first report, and after a change) and without
  it (every other poll), the routes section alone, and gzip-compressed.

Needs opensm, infiniband-diags, ibsim-utils and libumad2sim0. No Django, no database.
"""

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))

from agent.fabric_agent import COUNTER_TOOLS, FabricReader  # noqa: E402
from fabric.core.diags import parse_discovery, parse_dump_fts  # noqa: E402
from fabric.core.generators import fat_tree  # noqa: E402
from fabric.core.netfile import ibsim_netfile  # noqa: E402
from fabric.live_sim import SimulatedFabric  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--leaves", type=int, default=60)
    parser.add_argument("--hosts-per-leaf", type=int, default=32)
    parser.add_argument("--polls", type=int, default=3)
    parser.add_argument("--counters", choices=COUNTER_TOOLS, default="auto")
    args = parser.parse_args()
    spec = fat_tree(args.leaves * args.hosts_per_leaf, 2 * args.hosts_per_leaf, rate_gbps=100)
    print(f"fat tree: {len(spec.hosts)} hosts, {len(spec.switches)} switches, "
          f"{len(spec.links)} cables")
    with tempfile.TemporaryDirectory(prefix="ibex-poll-bench-") as scratch:
        sim = SimulatedFabric(Path(scratch), ibsim_netfile(spec))
        try:
            started = time.monotonic()
            sim.start_ibsim()
            print(f"ibsim ready: {time.monotonic() - started:.2f} s")
            started = time.monotonic()
            sim.start_opensm()
            print(f"OpenSM (ftree) start to SUBNET UP: {time.monotonic() - started:.2f} s")
            started = time.monotonic()
            text = subprocess.run(["ibnetdiscover"], env=sim.env, capture_output=True, text=True,
                                  timeout=120, check=True).stdout
            discover_s = time.monotonic() - started
            started = time.monotonic()
            discovery = parse_discovery(text)
            parse_s = time.monotonic() - started
            print(f"ibnetdiscover: {discover_s:.2f} s ({len(text.splitlines())} lines); "
                  f"parse: {parse_s:.3f} s; {len(discovery.nodes)} nodes, "
                  f"{len(discovery.links)} cables")
            reader = FabricReader(command_timeout_s=120, env=sim.env, counters_tool=args.counters)
            times = []
            for _ in range(args.polls):
                started = time.monotonic()
                report, topology = reader.read()
                times.append(time.monotonic() - started)
                if not report["reachable"]:
                    sys.exit(f"unreachable: {report['error']}")
            print(f"one poll ({reader.tool_for(discovery)}): median "
                  f"{statistics.median(times):.2f} s, worst {max(times):.2f} s "
                  f"({len(report['counters'])} ports' counters, "
                  f"{len(report.get('counter_errors', []))} nodes failed)")
            time_routes(sim, discovery)
            routes = json.dumps({"routes": reader.routes}).encode()
            print(f"routes section: {len(routes) / 1e3:.0f} kB "
                  f"({len(gzip.compress(routes)) / 1e3:.0f} kB gzipped), "
                  f"{len(reader.routes['switches'])} switch tables")
            full = json.dumps({**report, **topology}).encode()
            steady = json.dumps(report).encode()
            print(f"report with topology: {len(full) / 1e3:.0f} kB "
                  f"({len(gzip.compress(full)) / 1e3:.0f} kB gzipped); without: "
                  f"{len(steady) / 1e3:.0f} kB ({len(gzip.compress(steady)) / 1e3:.0f} kB gzipped)")
        finally:
            sim.stop()


def time_routes(sim: SimulatedFabric, discovery) -> None:
    started = time.monotonic()
    text = subprocess.run(["dump_fts", "-n"], env=sim.env, capture_output=True, text=True,
                          timeout=120, check=True).stdout
    one_run = time.monotonic() - started
    tables = parse_dump_fts(text)
    switches = [node.lid for node in discovery.nodes.values() if node.kind == "switch"]
    started = time.monotonic()
    for lid in switches:
        subprocess.run(["ibroute", str(lid)], env=sim.env, capture_output=True, text=True,
                       timeout=120, check=True)
    per_switch = time.monotonic() - started
    print(f"routes: dump_fts -n {one_run:.2f} s ({len(tables)} tables, "
          f"{sum(map(len, tables.values()))} entries); ibroute per switch "
          f"{per_switch:.2f} s for {len(switches)} switches")


if __name__ == "__main__":
    main()

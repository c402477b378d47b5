"""Heartbeat load generator: simulated node agents posting heartbeats as fast as they can.

Against a real IBEX server (registers the hosts first, rotating tokens of hosts that exist):
    python bench/heartbeat_load.py --api http://127.0.0.1:8000 --key KEY --fabric load \\
        --hosts 'load[0001-1000]' --workers 32 --duration 30
With no --api (as `make bench` runs it) it starts a stub server in a child process that
answers per the contract with no work behind it, which measures the agent side's own ceiling.

Each worker thread owns a share of the hosts and a keep-alive `requests.Session`, and posts
their heartbeats round-robin with no pause; actions in the answers are obeyed as `simulate` does.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.cli import hostnames_of  # noqa: E402
from agent.client import ApiError, ServerTrouble, Unreachable  # noqa: E402
from agent.errors import AgentError  # noqa: E402
from agent.fleet import Fleet, FleetOptions  # noqa: E402
from agent.heartbeat import heartbeat_body, parse_answer  # noqa: E402
from agent.simulated import Control, SimulatedHost  # noqa: E402


@dataclass
class WorkerResult:
    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api", help="the IBEX server; default: a stub server in a child process")
    parser.add_argument("--key", default="stub", help="provider API key")
    parser.add_argument("--fabric", default="load")
    parser.add_argument("--hosts", default="load[0001-0256]")
    parser.add_argument("--gpu-model", default="H100-80GB")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    return parser.parse_args(argv)


def hammer(fleet: Fleet, hosts: list[SimulatedHost], until: float) -> WorkerResult:
    """Post heartbeats for `hosts` round-robin, back to back, until the clock says stop."""
    result = WorkerResult()
    client = fleet.client()
    control = Control()
    live = [host for host in hosts if host.node_id is not None]
    while live and time.monotonic() < until:
        for host in list(live):
            body = heartbeat_body(host.sample(control), host.ib_ports(), host.leases)
            started = time.perf_counter()
            try:
                answer = parse_answer(client.heartbeat(host.node_id, host.token, body))
            except (ApiError, ServerTrouble, Unreachable) as error:
                kind = f"{error.status} {error.code}" if isinstance(error, ApiError) else type(error).__name__
                result.errors[kind] = result.errors.get(kind, 0) + 1
                if isinstance(error, ApiError) and error.status == 401:
                    live.remove(host)
                continue
            result.latencies_s.append(time.perf_counter() - started)
            host.leases.apply(answer.actions, host.hostname)
            if time.monotonic() >= until:
                break
    return result


def run(args: argparse.Namespace) -> dict:
    hostnames = hostnames_of(args.hosts)
    fleet = Fleet(FleetOptions(api=args.api, key=args.key, fabric=args.fabric, hostnames=hostnames,
                               gpu_model=args.gpu_model, gpus=args.gpus, workers=args.workers,
                               timeout_s=args.timeout))
    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        started = time.perf_counter()
        fleet.register_all(pool)
        registration_s = time.perf_counter() - started
        shares = [fleet.hosts[w :: args.workers] for w in range(args.workers)]
        started = time.perf_counter()
        until = time.monotonic() + args.duration
        results = list(pool.map(lambda share: hammer(fleet, share, until), shares))
        elapsed = time.perf_counter() - started
    latencies = sorted(latency for r in results for latency in r.latencies_s)
    errors: dict[str, int] = {}
    for r in results:
        for kind, count in r.errors.items():
            errors[kind] = errors.get(kind, 0) + count
    return {
        "server": args.api,
        "hosts": len(hostnames),
        "workers": args.workers,
        "registration_s": round(registration_s, 3),
        "seconds": round(elapsed, 3),
        "heartbeats": len(latencies),
        "heartbeats_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": _percentiles(latencies),
        "errors": errors,
    }


def _percentiles(latencies: list[float]) -> dict:
    if len(latencies) < 2:
        return {}
    cuts = statistics.quantiles(latencies, n=100)
    return {"p50": round(cuts[49] * 1000, 2), "p95": round(cuts[94] * 1000, 2),
            "p99": round(cuts[98] * 1000, 2), "max": round(latencies[-1] * 1000, 2)}


# the stub server, for runs without --api

def _stub_handler():
    next_id = iter(range(1, 10**9))
    lock = threading.Lock()

    class Stub(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # else headers and body wait on delayed ACKs (~40 ms)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path.endswith("/heartbeat/"):
                self._send(200, {"interval_s": 15, "node_state": "active", "actions": []})
            elif self.path.endswith("/bulk/"):
                with lock:
                    nodes = [{"id": next(next_id), "hostname": n["hostname"], "token": "ibexnode_stub",
                              "heartbeat_interval_s": 15} for n in body["nodes"]]
                self._send(201, {"nodes": nodes})
            elif re.search(r"/rotate-token/$", self.path):
                self._send(200, {"id": 0, "token": "ibexnode_stub"})
            else:
                self._send(404, {"error": {"code": "not_found", "message": "stub", "fields": {}}})

        def _send(self, status: int, answer: dict) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    return Stub


def _serve_stub(port_out) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _stub_handler())
    server.daemon_threads = True
    port_out.send(server.server_address[1])
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stub = None
    if not args.api:
        receive, send = multiprocessing.Pipe(duplex=False)
        stub = multiprocessing.Process(target=_serve_stub, args=(send,), daemon=True)
        stub.start()
        args.api = f"http://127.0.0.1:{receive.recv()}"
    try:
        result = run(args)
    except AgentError as error:
        print(f"heartbeat_load: {error}", file=sys.stderr)
        return 1
    finally:
        if stub is not None:
            stub.terminate()
            stub.join()
    if stub is not None:
        result["server"] = "stub (agent-side ceiling)"
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        latency = result["latency_ms"]
        print(f"{result['heartbeats']} heartbeats from {result['hosts']} hosts with {result['workers']} "
              f"workers in {result['seconds']} s against {result['server']}")
        print(f"  {result['heartbeats_per_s']} heartbeats/s; latency ms p50 {latency.get('p50')} "
              f"p95 {latency.get('p95')} p99 {latency.get('p99')} max {latency.get('max')}")
        print(f"  registration of {result['hosts']} hosts: {result['registration_s']} s; "
              f"errors: {result['errors'] or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

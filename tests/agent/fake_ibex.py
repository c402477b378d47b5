"""A small real HTTP server that speaks the IBEX node API contract, for the agent's tests.

It keeps nodes in memory, records every request, and can be told to queue heartbeat actions,
answer with a chosen status, or change the interval it hands out. It stores shipped log lines
as the server does (by line number, skipping lines it has, answering `next_line`) and, when
`hold_heartbeats` is set, holds a heartbeat with `wait_s` until an action is queued.
"""

import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

PROVIDER_KEY = "ibexkey_test"
PAGE_SIZE = 2  # small, so that listing nodes has to follow `next`


@dataclass
class Recorded:
    method: str
    path: str
    query: dict
    headers: dict
    body: object


@dataclass
class FakeNode:
    id: int
    hostname: str
    spec: dict
    token: str
    state: str = "registering"
    heartbeats: list[dict] = field(default_factory=list)
    # (lease, generation) -> line number -> line, as shipped to the logs endpoint
    logs: dict[tuple[str, int], dict[int, str]] = field(default_factory=dict)

    def log_lines(self, lease: str, generation: int = 1) -> list[str]:
        lines = self.logs.get((lease, generation), {})
        return [lines[number] for number in sorted(lines)]

    def workload(self, lease: str) -> dict | None:
        """The lease's entry in the latest heartbeat's `workloads`."""
        entries = self.heartbeats[-1].get("workloads") or [] if self.heartbeats else []
        return next((entry for entry in entries if entry["lease"] == lease), None)


class FakeIbex:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Recorded] = []
        self.nodes: dict[int, FakeNode] = {}
        self.next_id = 17
        self.registration_interval_s = 15
        self.heartbeat_interval_s: float = 15
        self.pending_actions: dict[int, list[dict]] = {}
        self.heartbeat_failures: list[int] = []  # statuses to answer the next heartbeats with
        self.bulk_conflict_fields = False  # name every conflicting item of a bulk 409 in fields
        self.hold_heartbeats = False  # honour wait_s: hold an answer until an action is queued
        self.work_queued = threading.Condition(self.lock)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> "FakeIbex":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # helpers for tests

    def node_named(self, hostname: str) -> FakeNode:
        return next(node for node in self.nodes.values() if node.hostname == hostname)

    def add_node(self, hostname: str, fabric: str = "fab1", state: str = "registering") -> FakeNode:
        with self.lock:
            node = self._create({"hostname": hostname, "gpu_count": 8, "fabric": fabric})
            node.state = state
            return node

    def queue_action(self, node_id: int, action: str, lease: str, gpus: list[int], **extra) -> None:
        """Queue an action for the node's next heartbeat; `extra`: launch, until, grace_s."""
        with self.lock:
            self.pending_actions.setdefault(node_id, []).append(
                {"action": action, "lease": lease, "gpus": gpus, **extra}
            )
            self.work_queued.notify_all()

    def paths(self, method: str | None = None) -> list[str]:
        return [r.path for r in self.requests if method is None or r.method == method]

    # server side

    def _create(self, spec: dict) -> FakeNode:
        node = FakeNode(self.next_id, spec["hostname"], spec, "ibexnode_" + secrets.token_hex(8))
        self.nodes[node.id] = node
        self.next_id += 1
        return node

    def _answer(self, node: FakeNode) -> dict:
        count = node.spec.get("gpu_count", 0)
        return {
            "id": node.id, "hostname": node.hostname, "fabric": node.spec.get("fabric"),
            "state": "registering", "token": node.token,
            "heartbeat_interval_s": self.registration_interval_s,
            "gpus": [{"id": node.id * 100 + i, "index": i, "uuid": f"GPU-{node.id}-{i}",
                      "gpu_model": node.spec.get("gpu_model"), "health": "ok"} for i in range(count)],
        }

    def _provider_owned(self, hostname: str, fabric: str | None) -> FakeNode | None:
        """The live node on that host: as the server, one per (fabric, hostname)."""
        return next((n for n in self.nodes.values() if n.hostname == hostname
                     and n.spec.get("fabric") == fabric and n.state != "retired"), None)

    def handle(self, method: str, path: str, query: dict, headers: dict, body) -> tuple[int, dict]:
        with self.lock:
            self.requests.append(Recorded(method, path, query, headers, body))
            heartbeat = re.fullmatch(r"/api/v1/nodes/(\d+)/heartbeat/", path)
            if heartbeat and method == "POST":
                return self._heartbeat(int(heartbeat.group(1)), headers, body)
            logs = re.fullmatch(r"/api/v1/nodes/(\d+)/logs/", path)
            if logs and method == "POST":
                return self._logs(int(logs.group(1)), headers, body)
            if headers.get("Authorization") != f"Bearer {PROVIDER_KEY}":
                return 401, _error("not_authenticated", "Invalid API key.")
            if path == "/api/v1/nodes/" and method == "POST":
                existing = self._provider_owned(body["hostname"], body.get("fabric"))
                if existing:
                    return 409, _error("node_exists", f"node {existing.id} already has this hostname")
                return 201, self._answer(self._create(body))
            if path == "/api/v1/nodes/bulk/" and method == "POST":
                return self._bulk(body)
            if path == "/api/v1/nodes/" and method == "GET":
                return 200, self._list(query)
            rotate = re.fullmatch(r"/api/v1/nodes/(\d+)/rotate-token/", path)
            if rotate and method == "POST" and int(rotate.group(1)) in self.nodes:
                node = self.nodes[int(rotate.group(1))]
                node.token = "ibexnode_" + secrets.token_hex(8)
                return 200, {"id": node.id, "token": node.token}
            return 404, _error("not_found", "Not found.")

    def _bulk(self, body: dict) -> tuple[int, dict]:
        specs = body["nodes"]
        if len(specs) > 1000:
            return 400, _error("invalid", "at most 1000 nodes", {"nodes": ["too many"]})
        conflicts = [(i, spec) for i, spec in enumerate(specs)
                     if self._provider_owned(spec["hostname"], spec.get("fabric"))]
        if conflicts:
            # as the IBEX server does: the message names the first; `fields` only if asked
            first = conflicts[0][1]
            node = self._provider_owned(first["hostname"], first.get("fabric"))
            message = f"{first['hostname']} is already registered as node {node.id}"
            fields = {f"nodes.{i}.hostname": [message] for i, _ in conflicts}
            return 409, _error("node_exists", message, fields if self.bulk_conflict_fields else None)
        return 201, {"nodes": [self._answer(self._create(spec)) for spec in specs]}

    def _list(self, query: dict) -> dict:
        nodes = sorted(self.nodes.values(), key=lambda n: -n.id)  # newest first, as the server
        if "hostname" in query:
            nodes = [n for n in nodes if n.hostname == query["hostname"][0]]
        start = int(query.get("cursor", ["0"])[0])
        page = nodes[start : start + PAGE_SIZE]
        more = start + PAGE_SIZE < len(nodes) and "hostname" not in query
        return {
            "results": [{"id": n.id, "hostname": n.hostname, "state": n.state,
                         "fabric": n.spec.get("fabric")} for n in page],
            "next": f"{self.url}/api/v1/nodes/?cursor={start + PAGE_SIZE}" if more else None,
            "previous": None,
        }

    def _heartbeat(self, node_id: int, headers: dict, body: dict) -> tuple[int, dict]:
        node = self.nodes.get(node_id)
        if node is None or headers.get("Authorization") != f"Node {node.token}":
            return 401, _error("not_authenticated", "Invalid node token.")
        if self.heartbeat_failures:
            return self.heartbeat_failures.pop(0), _error("unavailable", "try later")
        node.heartbeats.append(body)
        wait_s = body.get("wait_s") or 0
        if self.hold_heartbeats and wait_s:
            # Condition.wait releases the lock: other nodes and tests go on meanwhile
            self.work_queued.wait_for(lambda: self.pending_actions.get(node_id), timeout=wait_s)
        return 200, {
            "interval_s": self.heartbeat_interval_s,
            "node_state": "active",
            "actions": self.pending_actions.pop(node_id, []),
        }

    def _logs(self, node_id: int, headers: dict, body: dict) -> tuple[int, dict]:
        node = self.nodes.get(node_id)
        if node is None or headers.get("Authorization") != f"Node {node.token}":
            return 401, _error("not_authenticated", "Invalid node token.")
        lines = body["lines"]
        if sum(len(line.encode()) for line in lines) > 2 * 1024 * 1024 or any(
                len(line.encode()) > 64 * 1024 for line in lines):
            return 400, _error("invalid", "too much", {"lines": ["at most 2 MiB, 64 KiB a line"]})
        stored = node.logs.setdefault((str(body["lease"]), int(body["generation"])), {})
        for number, line in enumerate(lines, start=int(body["from_line"])):
            stored.setdefault(number, line)
        return 200, {"next_line": max(stored) + 1 if stored else 0}

    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the real server behind gunicorn
            disable_nagle_algorithm = True  # else each answer waits ~40 ms on a delayed ACK

            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                status, answer = fake.handle(method, url.path, parse_qs(url.query), dict(self.headers), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args) -> None:
                pass

        return Handler


def _error(code: str, message: str, fields: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "fields": fields or {}}}

"""A stub of the IBEX API on 127.0.0.1 for the client's unit tests: answers scripted per
method and path, every request recorded."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict | None


class StubApi:
    def __init__(self):
        self.answers: dict[tuple[str, str], list[tuple[int, object]]] = {}
        self.seen: list[Seen] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                stub.seen.append(Seen(self.command, parts.path,
                                      {k: v[0] for k, v in parse_qs(parts.query).items()},
                                      dict(self.headers), json.loads(raw) if raw else None))
                queue = stub.answers.get((self.command, parts.path))
                status, body = (queue.pop(0) if len(queue) > 1 else queue[0]) if queue else (
                    404, {"error": {"code": "not_found", "message": "No such page.",
                                    "fields": {}}})
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    def answer(self, method: str, path: str, *answers: tuple[int, object]) -> None:
        """Answer these in turn; the last one again and again."""
        self.answers[(method, path)] = list(answers)

    def requests_to(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

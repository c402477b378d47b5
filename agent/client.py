"""The HTTP client for the IBEX node API (`/api/v1/nodes/...`).

Failures come back as three kinds of AgentError, because callers treat them differently:
`Unreachable` and `ServerTrouble` are worth retrying later; `ApiError` (a 4xx) is not.
"""

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote, urljoin

import requests

from agent.errors import AgentError

DEFAULT_TIMEOUT_S = 10.0
BULK_LIMIT = 1000  # the server takes at most this many nodes per bulk request
FIELDS_SHOWN = 3  # field errors named in a one-line message


class Unreachable(AgentError):
    """No HTTP answer at all: connection refused, name not resolved, timed out."""


class ServerTrouble(AgentError):
    """A 5xx, a 429, or an answer that is not the JSON we expect."""


@dataclass
class ApiError(AgentError):
    """A 4xx with the server's error body: {"error": {"code", "message", "fields"}}."""

    status: int
    code: str
    message: str
    fields: dict[str, list[str]] = field(default_factory=dict)
    credential: str = "key"

    def __str__(self) -> str:
        if self.status == 401:
            return f"the server refused the {self.credential} (401)"
        if 300 <= self.status < 400:
            return f"{self.message} ({self.status}); give that address (scheme and host) as --api"
        text = f"the server said {self.status} {self.code}: {self.message}"
        if self.fields:
            # a bulk request can fail on hundreds of items: name the first few, count the rest
            shown = list(self.fields.items())[:FIELDS_SHOWN]
            details = "; ".join(f"{name}: {' '.join(map(str, msgs))}" for name, msgs in shown)
            if len(self.fields) > FIELDS_SHOWN:
                details += f"; and {len(self.fields) - FIELDS_SHOWN} more"
            text += f" ({details})"
        return text


class ApiClient:
    def __init__(
        self,
        api: str,
        session: requests.Session | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.api = api.rstrip("/")
        self.session = session or requests.Session()
        self.timeout_s = timeout_s

    # provider-key calls

    def register_node(self, key: str, spec: dict) -> dict:
        return self._call("POST", "/api/v1/nodes/", _bearer(key), spec, idempotent_create=True)

    def register_nodes(self, key: str, specs: list[dict]) -> list[dict]:
        if len(specs) > BULK_LIMIT:
            raise ValueError(f"at most {BULK_LIMIT} nodes per bulk request")
        answer = self._call(
            "POST", "/api/v1/nodes/bulk/", _bearer(key), {"nodes": specs}, idempotent_create=True
        )
        return _expect_list(answer, "nodes")

    def find_nodes(self, key: str, hostname: str) -> list[dict]:
        """The provider's nodes with this hostname (retired ones and other fabrics included)."""
        answer = self._call("GET", "/api/v1/nodes/", _bearer(key), params={"hostname": hostname})
        return _expect_list(answer, "results")

    def list_nodes(self, key: str) -> Iterator[dict]:
        """Every node of the key's provider, following the cursor pages."""
        url: str | None = "/api/v1/nodes/"
        while url:
            answer = self._call("GET", url, _bearer(key))
            yield from _expect_list(answer, "results")
            url = answer.get("next")

    def rotate_token(self, key: str, node_id: int) -> str:
        answer = self._call("POST", f"/api/v1/nodes/{node_id}/rotate-token/", _bearer(key), {})
        token = answer.get("token")
        if not isinstance(token, str):
            raise ServerTrouble("the rotate-token answer carries no token")
        return token

    def import_fabric(self, key: str, name: str, text: str, fmt: str, gpus_per_node: int) -> dict:
        """Create or update a fabric from a topology file (multipart, as a provider uploads it)."""
        url = f"{self.api}/api/v1/fabrics/import/"
        try:
            response = self.session.post(
                url, headers=_bearer(key), timeout=self.timeout_s, allow_redirects=False,
                data={"name": name, "format": fmt, "gpus_per_node": str(gpus_per_node)},
                files={"file": (f"{name}-topology.conf", text.encode(), "text/plain")})
        except requests.RequestException as error:
            raise Unreachable(f"cannot reach {self.api}: {describe_connection_error(error)}") from None
        return _decode(response, "key")

    def gateway_heartbeat(self, key: str, body: dict) -> dict:
        """A fabric gateway's report of all its nodes; answered with the reservations to hold."""
        return self._call("POST", "/api/v1/gateway/heartbeat/", _bearer(key), body)

    def fabric_report(self, key: str, fabric: str, body: dict) -> dict:
        """The fabric agent's report of what it saw; answered with what the server holds."""
        return self._call("POST", f"/api/v1/fabrics/{quote(fabric, safe='')}/reports/",
                          _bearer(key), body)

    # node-token call

    def heartbeat(self, node_id: int, token: str, body: dict) -> dict:
        """One heartbeat. With `wait_s` in the body the server may hold the answer that long,
        so the timeout grows by as much."""
        headers = {"Authorization": f"Node {token}"}
        timeout_s = self.timeout_s + float(body.get("wait_s") or 0)
        return self._call(
            "POST", f"/api/v1/nodes/{node_id}/heartbeat/", headers, body, credential="node token",
            timeout_s=timeout_s,
        )

    def post_logs(self, node_id: int, token: str, body: dict) -> int:
        """Ship a lease's log lines; the line number the server expects next."""
        headers = {"Authorization": f"Node {token}"}
        answer = self._call(
            "POST", f"/api/v1/nodes/{node_id}/logs/", headers, body, credential="node token"
        )
        next_line = answer.get("next_line")
        if not isinstance(next_line, int) or isinstance(next_line, bool) or next_line < 0:
            raise ServerTrouble("the logs answer carries no next_line")
        return next_line

    # plumbing

    def _call(
        self,
        method: str,
        path_or_url: str,
        headers: dict[str, str],
        body: dict | None = None,
        params: dict | None = None,
        credential: str = "key",
        idempotent_create: bool = False,
        timeout_s: float | None = None,
    ) -> dict:
        url = urljoin(self.api + "/", path_or_url.lstrip("/")) if path_or_url.startswith("/") else path_or_url
        if idempotent_create:
            # the server may replay a creating POST it has seen; harmless if it ignores the header
            headers = {**headers, "Idempotency-Key": str(uuid.uuid4())}
        timeout_s = timeout_s or self.timeout_s
        try:
            # no redirects: requests would turn a redirected POST into a GET without its body
            response = self.session.request(
                method, url, headers=headers, json=body, params=params, timeout=timeout_s,
                allow_redirects=False,
            )
        except requests.Timeout:
            raise Unreachable(f"cannot reach {self.api}: no answer within {timeout_s:g} s") from None
        except requests.RequestException as error:
            raise Unreachable(f"cannot reach {self.api}: {describe_connection_error(error)}") from None
        return _decode(response, credential)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _decode(response: requests.Response, credential: str) -> dict:
    status = response.status_code
    if 300 <= status < 400:
        target = response.headers.get("Location", "elsewhere")
        raise ApiError(status=status, code="redirect", message=f"the server redirects to {target}")
    if status >= 500 or status == 429:
        raise ServerTrouble(f"the server answered {status} {response.reason or ''}".rstrip())
    try:
        data = response.json()
    except ValueError:
        data = None
    if 400 <= status < 500:
        error = (data or {}).get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        raise ApiError(
            status=status,
            code=str(error.get("code") or "error"),
            message=str(error.get("message") or response.reason or ""),
            fields=error.get("fields") or {},
            credential=credential,
        )
    if not isinstance(data, dict):
        raise ServerTrouble(f"the server's answer ({status}) is not a JSON object")
    return data


def _expect_list(answer: dict, key: str) -> list[dict]:
    items = answer.get(key)
    if not isinstance(items, list):
        raise ServerTrouble(f"the server's answer has no '{key}' list")
    return items


def describe_connection_error(error: BaseException) -> str:
    """`connection refused`, `name or service not known`, ... from requests' wrapped errors."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return current.strerror.lower()
        pending.extend([current.__cause__, current.__context__, getattr(current, "reason", None)])
        pending.extend(arg for arg in current.args if isinstance(arg, BaseException))
    return str(error) or type(error).__name__

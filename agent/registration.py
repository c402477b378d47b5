"""Registering one node, and getting a fresh token when the hostname is already registered."""

import logging
from dataclasses import dataclass

from agent.client import ApiClient, ApiError, ServerTrouble
from agent.errors import AgentError

log = logging.getLogger("ibex-agent")


@dataclass
class Registered:
    hostname: str
    node_id: int
    token: str
    interval_s: float | None
    already_existed: bool


def register_or_rotate(client: ApiClient, key: str, spec: dict) -> Registered:
    """Create the node; if the provider already has that hostname (409), rotate its token."""
    hostname = spec["hostname"]
    try:
        answer = client.register_node(key, spec)
    except ApiError as error:
        if error.status != 409 or error.code != "node_exists":
            raise
        registered = rotate_existing(client, key, hostname, spec["fabric"])
        log.info("%s was already registered as node %d; rotated its token", hostname, registered.node_id)
        return registered
    return from_answer(answer, hostname)


def from_answer(answer: dict, hostname: str) -> Registered:
    """A registration answer, checked: a malformed one is server trouble, not a traceback."""
    try:
        return Registered(
            hostname=hostname,
            node_id=int(answer["id"]),
            token=str(answer["token"]),
            interval_s=answer.get("heartbeat_interval_s"),
            already_existed=False,
        )
    except (KeyError, TypeError, ValueError):
        raise ServerTrouble(f"the registration answer for {hostname} lacks an id or a token") from None


def rotate_existing(
    client: ApiClient, key: str, hostname: str, fabric: str, node_id: int | None = None
) -> Registered:
    """A fresh token for the provider's existing node `hostname` (found by name unless given)."""
    if node_id is None:
        node_id = pick_node(client.find_nodes(key, hostname), hostname, fabric)
        if node_id is None:
            raise AgentError(f"the server says {hostname} is registered but does not list it")
    token = client.rotate_token(key, node_id)
    return Registered(hostname, node_id, token, interval_s=None, already_existed=True)


def pick_node(entries: list[dict], hostname: str, fabric: str) -> int | None:
    """The id of the live node called `hostname`, preferring the one in `fabric`.

    A hostname can also belong to a retired node, or to a node in another of the provider's
    fabrics; the server lists newest first, so among equals the newest wins.
    """
    live = [
        entry for entry in entries
        if entry.get("hostname") == hostname and entry.get("state") != "retired"
        and isinstance(entry.get("id"), int)
    ]
    in_fabric = [entry for entry in live if str(entry.get("fabric")) == fabric]
    chosen = (in_fabric or live or [None])[0]
    return chosen["id"] if chosen else None

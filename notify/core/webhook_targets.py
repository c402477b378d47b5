"""Where a webhook may be sent: a pure check (no Django) of a URL and the addresses its host
resolves to, so that a tenant cannot make IBEX's workers call into the internal network.

Refused: schemes other than https (http only where the operator allows it), credentials in the
URL, and any address that is not public: loopback, private, link-local (the cloud metadata
service at 169.254.169.254), shared, multicast, reserved or unspecified, IPv4 written inside
IPv6 included. The operator's exception list (networks in CIDR form) lets chosen ones through.
The check runs on the resolved addresses, at creation and again at each delivery, and the
delivery connects to an address that was checked (a name that changes its answer between the
check and the connection gains nothing).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


class RefusedTarget(ValueError):
    """The URL may not receive webhooks; the message says why, for the tenant."""


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int
    addresses: tuple[str, ...]  # each one checked


def parse_networks(text: str | Iterable[str]) -> list[Network]:
    """"127.0.0.1/32, 10.1.0.0/16" → networks; a bad entry raises ValueError naming it."""
    items = text.split(",") if isinstance(text, str) else list(text)
    networks = []
    for item in (i.strip() for i in items):
        if item:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"not a network: {item!r}") from None
    return networks


def why_forbidden(address: str, allowed: list[Network] = ()) -> str | None:
    """Why an address may not receive webhooks, or None when it may."""
    ip: Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip in network for network in allowed):
        return None
    for test, what in ((ip.is_loopback, "a loopback"), (ip.is_link_local, "a link-local"),
                       (ip.is_multicast, "a multicast"), (ip.is_unspecified, "an unspecified"),
                       (ip.is_private, "a private"), (ip.is_reserved, "a reserved")):
        if test:
            return f"{ip} is {what} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port,
                                                              type=socket.SOCK_STREAM)})


def check_url(url: str, *, allow_http: bool = False, allowed: list[Network] = (),
              resolve: Resolver = system_resolver, unresolved_ok: bool = False) -> Target:
    """The URL's target with its checked addresses; RefusedTarget says why not.

    With `unresolved_ok` a name that does not resolve passes with no addresses (an endpoint
    registered before its name is published; each delivery checks again)."""
    parts = urlsplit((url or "").strip())
    schemes = ("https", "http") if allow_http else ("https",)
    if parts.scheme not in schemes:
        raise RefusedTarget("Webhook URLs use https." if not allow_http
                            else "Webhook URLs use http or https.")
    if not parts.hostname:
        raise RefusedTarget("The URL has no host.")
    if parts.username or parts.password:
        raise RefusedTarget("Put no credentials in the URL; check the signature instead.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RefusedTarget("The URL's port is not a number from 1 to 65535.") from None
    host = parts.hostname
    if _is_address(host):
        addresses = [host]
    elif host == "localhost" or host.endswith(".localhost"):
        addresses = ["127.0.0.1"]
    else:
        try:
            addresses = resolve(host, port)
        except OSError:
            addresses = []
        if not addresses and not unresolved_ok:
            raise RefusedTarget(f"{host} does not resolve.")
    for address in addresses:
        reason = why_forbidden(address, allowed)
        if reason:
            raise RefusedTarget(f"Webhooks are not sent to internal addresses: {reason}.")
    return Target(url=parts.geturl(), scheme=parts.scheme, host=host, port=port,
                  addresses=tuple(addresses))


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True

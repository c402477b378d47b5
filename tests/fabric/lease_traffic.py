"""Reports of the lab fabric (`tests.market.inventory.provider_with_nodes`: 4 hosts, 2 leaves)
with chosen counters on chosen ports, posted as the fabric agent does."""

from __future__ import annotations

from datetime import datetime

from fabric.core import generators
from fabric.core.diags import link_key
from fabric.models import Port
from tests.fabric.reports import key_of, report

LAB = generators.fat_tree(4, 4, tiers=2, prefix="hpc-provider-")
HCA_OF = {hca.host: hca.guid for hca in LAB.hcas}


def hca_link(host: str):
    """The host's only HCA cable in the spec."""
    return next(link for link in LAB.links if HCA_OF[host] in (link.a_guid, link.b_guid))


def hca_port(host: str) -> tuple[str, int]:
    port = Port.objects.get(hca__host__name=host, link__isnull=False)
    return port.device_guid, port.number


def counters(xmit_by_host: dict[str, int], *, errors: dict | None = None) -> dict:
    """(guid, port) → counters: each host's HCA port sending `xmit` words (extended)."""
    return {hca_port(host): {"extended": True, "xmit_data": xmit, **(errors or {})}
            for host, xmit in xmit_by_host.items()}


def post_report(client, at: datetime, *, xmit: dict[str, int] | None = None,
                without_hosts=(), without_links=(), extra: dict | None = None,
                body_extra: dict | None = None):
    """`without_hosts`: their HCA cables are unplugged; `without_links`: IBEX `Link` rows."""
    found = counters(xmit or {})
    found.update(extra or {})
    without = {key_of(hca_link(host)) for host in without_hosts}
    for link in without_links:
        (a_guid, a_port), (b_guid, b_port) = Port.objects.filter(link=link).order_by(
            "link_end").values_list("device_guid", "number")
        without.add(link_key(a_guid, a_port, b_guid, b_port))
    body = report(LAB, at, without=without, counters=found)
    body.update(body_extra or {})
    response = client.post("/api/v1/fabrics/lab/reports/", body, format="json")
    assert response.status_code == 200, response.json()
    return response.json()

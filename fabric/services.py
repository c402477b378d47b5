"""Every change to fabrics goes through here: import (files or generators) and deletion.

An import is one transaction: the file is parsed and checked in full before anything is
written, and re-importing a fabric updates its switches and hosts in place (by GUID and by
host name), so nodes registered on its hosts keep pointing at them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from decimal import Decimal

from django.db import transaction

from fabric.core.errors import FabricFormatError
from fabric.core.ibnetdiscover import parse_ibnetdiscover
from fabric.core.levels import analyse, summarise
from fabric.core.slurm import parse_slurm_topology
from fabric.core.spec import FabricSpec
from fabric.core.topology import bandwidth_inputs
from fabric.models import Fabric, Hca, Host, Link, Port, Switch
from ibex.accounts.models import Organization
from ibex.db import analyze_after_bulk_load
from ibex.errors import Refusal

FORMATS = ("ibnetdiscover", "slurm")
BATCH = 5000
MAX_HOSTS_PER_FABRIC = 200_000


class FabricImportError(Refusal):
    """A fabric that cannot be imported; the message is meant for the person importing it,
    and the fault is in the file."""

    field = "file"


@dataclass(frozen=True)
class ImportResult:
    fabric: Fabric
    created: bool
    summary: dict


def parse_fabric_file(text: str, *, fmt: str, path: str, gpus_per_node: int = 8) -> FabricSpec:
    if fmt == "ibnetdiscover":
        return parse_ibnetdiscover(text, path=path, gpus_per_node=gpus_per_node)
    if fmt == "slurm":
        return parse_slurm_topology(text, path=path, gpus_per_node=gpus_per_node)
    raise FabricImportError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")


def import_fabric_file(*, owner: Organization, name: str, text: str, fmt: str, path: str,
                       gpus_per_node: int = 8) -> ImportResult:
    try:
        spec = parse_fabric_file(text, fmt=fmt, path=path, gpus_per_node=gpus_per_node)
    except FabricFormatError as exc:
        raise FabricImportError(str(exc)) from exc
    return save_fabric(owner=owner, name=name, spec=spec, source=fmt)


def _decimal(rate: float | None) -> Decimal | None:
    return None if rate is None else Decimal(str(rate))


@transaction.atomic
def save_fabric(*, owner: Organization, name: str, spec: FabricSpec, source: str) -> ImportResult:
    if not spec.hcas:
        raise FabricImportError(f"{spec.source or name}: the fabric has no hosts")
    if len(spec.hosts) > MAX_HOSTS_PER_FABRIC:
        raise FabricImportError(f"{spec.source or name}: {len(spec.hosts)} hosts, more than the "
                                f"{MAX_HOSTS_PER_FABRIC} a fabric may have")
    levels = analyse(spec)
    summary = summarise(spec)
    rates = Counter(link.rate_gbps for link in spec.links if link.rate_gbps)
    kind = "single-switch" if len(spec.switches) == 1 else spec.kind
    fabric = Fabric.objects.select_for_update().filter(name=name).first()
    created = fabric is None
    if fabric is not None and fabric.owner_id != owner.id:
        raise FabricImportError(f"fabric {name!r} belongs to another organisation")
    host_gbps, leaf_uplinks, spine_uplinks = bandwidth_inputs(spec, levels)
    summary["uplink_gbps"] = {"leaf": leaf_uplinks, "spine": spine_uplinks}
    values = {
        "kind": kind, "source": source, "summary": summary,
        "link_rate_gbps": _decimal(rates.most_common(1)[0][0]) if rates else None,
        "torus_dims": list(spec.torus_dims) if spec.torus_dims else None,
    }
    if created:
        fabric = Fabric.objects.create(owner=owner, name=name, **values)
    else:
        Fabric.objects.filter(pk=fabric.pk).update(**values)
        fabric.refresh_from_db()
    _save_switches(fabric, spec, levels.tiers)
    host_ids = _save_hosts(fabric, spec, levels.nodes, host_gbps)
    _save_ports_and_links(fabric, spec, host_ids)
    analyze_after_bulk_load(Switch, Host, Hca, Link, Port, rows=len(spec.links))
    return ImportResult(fabric=fabric, created=created, summary=summary)


def _save_switches(fabric: Fabric, spec: FabricSpec, tiers: dict[str, str]) -> None:
    rows = [
        Switch(fabric=fabric, guid=s.guid, name=s.name, tier=tiers.get(s.guid, s.tier or "leaf"),
               port_count=s.ports, group=s.group or "", coords=list(s.coords) if s.coords else None)
        for s in spec.switches
    ]
    Switch.objects.bulk_create(
        rows, batch_size=BATCH, update_conflicts=True, unique_fields=["fabric", "guid"],
        update_fields=["name", "tier", "port_count", "group", "coords"],
    )
    Switch.objects.filter(fabric=fabric).exclude(guid__in=[s.guid for s in spec.switches]).delete()


def _save_hosts(fabric, spec, domains, host_gbps) -> dict[str, int]:
    rows = [
        Host(fabric=fabric, name=host, leaf=d.leaf, spine=d.spine, gpus=spec.gpus_of(host),
             coords=list(d.coords) if d.coords else None, bandwidth_gbps=host_gbps.get(host, 0.0))
        for host, d in domains.items()
    ]
    Host.objects.bulk_create(
        rows, batch_size=BATCH, update_conflicts=True, unique_fields=["fabric", "name"],
        update_fields=["leaf", "spine", "gpus", "coords", "bandwidth_gbps"],
    )
    Host.objects.filter(fabric=fabric).exclude(name__in=list(domains)).delete()
    return dict(Host.objects.filter(fabric=fabric).values_list("name", "id"))


def _save_ports_and_links(fabric: Fabric, spec: FabricSpec, host_ids: dict[str, int]) -> None:
    # Ports and links belong to the fabric alone (nothing else points at them): rebuild them.
    Port.objects.filter(fabric=fabric).delete()
    Link.objects.filter(fabric=fabric).delete()
    hcas: dict[str, Hca] = {}
    for hca in spec.hcas:
        hcas.setdefault(hca.guid, Hca(fabric=fabric, guid=hca.guid, host_id=host_ids[hca.host],
                                      description=hca.description))
    Hca.objects.bulk_create(
        list(hcas.values()), batch_size=BATCH, update_conflicts=True,
        unique_fields=["fabric", "guid"], update_fields=["host", "description"],
    )
    Hca.objects.filter(fabric=fabric).exclude(guid__in=list(hcas)).delete()
    hca_ids = dict(Hca.objects.filter(fabric=fabric).values_list("guid", "id"))
    switch_ids = dict(Switch.objects.filter(fabric=fabric).values_list("guid", "id"))
    links = Link.objects.bulk_create(
        [Link(fabric=fabric, rate_gbps=_decimal(link.rate_gbps), width=link.width or "",
              state=link.state.lower()) for link in spec.links],
        batch_size=BATCH,
    )
    ports = []
    for row, link in zip(links, spec.links, strict=True):
        for end, guid, number in (("a", link.a_guid, link.a_port), ("b", link.b_guid, link.b_port)):
            ports.append(Port(
                fabric=fabric, switch_id=switch_ids.get(guid), hca_id=hca_ids.get(guid),
                number=number, device_guid=guid, link=row, link_end=end,
            ))
    Port.objects.bulk_create(ports, batch_size=BATCH)

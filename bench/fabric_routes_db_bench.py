"""The routes on the server, on the 1,920-host fat tree (60 leaves x 32 under 32 spines):
validate and store a report's `routes` section (92 switch tables, 2,012 LIDs), read them back
as a RouteMap, trace a lease's ring, and read a guaranteed placement's loads with the
database. Uses DATABASE_URL (or the embedded PostgreSQL) and cleans up after itself.

    python bench/fabric_routes_db_bench.py
"""

import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

from fabric import services  # noqa: E402
from fabric.api import FabricReportSerializer  # noqa: E402
from fabric.core.fabric_report import REPORT_VERSION, routes_hash  # noqa: E402
from fabric.core.generators import fat_tree  # noqa: E402
from fabric.models import Fabric, FabricRoutes, Port  # noqa: E402
from fabric.selectors import admission_routes, lease_links, route_map  # noqa: E402
from ibex.accounts.models import Organization  # noqa: E402


def timed(label, action, repeat=1):
    best = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    print(f"{label}: {best * 1e3:.0f} ms" + (f" (best of {repeat})" if repeat > 1 else ""),
          flush=True)
    return result


def main():
    owner, _ = Organization.objects.get_or_create(slug="bench-provider",
                                                  defaults={"name": "bench", "is_provider": True})
    clean()
    spec = fat_tree(1920, 64, rate_gbps=100)
    services.save_fabric(owner=owner, name="bench-routes", spec=spec, source="generator")
    fabric = Fabric.objects.get(name="bench-routes")
    try:
        derived = timed("derive routes from the topology (no agent)",
                        lambda: admission_routes(fabric))
        section = {"lids": dict(derived.lids),
                   "switches": {guid: table.hex() for guid, table in derived.tables.items()}}
        body = {"version": REPORT_VERSION, "observed_at": datetime.now(UTC).isoformat(),
                "reachable": True, "error": "", "topology_hash": "sha256:x",
                "routes_hash": routes_hash(section), "routes": section}
        form = FabricReportSerializer(data=body)
        timed("validate the report's routes (DRF)", lambda: form.is_valid(raise_exception=True))
        timed("record_fabric_report with routes (store one row)", lambda: services.record_fabric_report(
            provider=owner, fabric_name=fabric.name, report=form.validated_data))
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_column_size(lids) + pg_column_size(tables) "
                           "FROM fabric_fabricroutes WHERE fabric_id = %s", [fabric.pk])
            print(f"stored: {cursor.fetchone()[0] / 1e3:.0f} kB in PostgreSQL (TOAST-compressed)")
        assert FabricRoutes.objects.filter(fabric=fabric).exists()
        route = timed("route_map: read and decode the routes", lambda: route_map(fabric),
                      repeat=3)
        hosts = sorted(route.host_ports)
        ring = [hosts[i * 97 % len(hosts)] for i in range(16)]
        timed("a 16-node ring's directed links (lease_links, reads the routes too)",
              lambda: lease_links(fabric, ring), repeat=3)
    finally:
        clean()


def clean():
    # ports first: deleting a fabric's links sets its ports' link to NULL, which their
    # check constraint (a linked port has an end) refuses while they still exist
    Port.objects.filter(fabric__name__startswith="bench-").delete()
    Fabric.objects.filter(name__startswith="bench-").delete()


if __name__ == "__main__":
    main()

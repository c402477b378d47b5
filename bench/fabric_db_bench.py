"""Fabric with the database: save a 100,000-GPU fat-tree, read its snapshot back, import a
10,000-node topology.conf. Uses DATABASE_URL (or the embedded PostgreSQL) and cleans up after
itself.

    python bench/fabric_db_bench.py
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

import django  # noqa: E402

django.setup()

from fabric import services  # noqa: E402
from fabric.core.generators import fat_tree  # noqa: E402
from fabric.core.slurm import export_slurm_tree  # noqa: E402
from fabric.models import Fabric, Host, Link, Port  # noqa: E402
from fabric.selectors import load_snapshot  # noqa: E402
from ibex.accounts.models import Organization  # noqa: E402


def timed(label, action):
    started = time.perf_counter()
    result = action()
    print(f"{label}: {time.perf_counter() - started:.2f} s", flush=True)
    return result


def main():
    owner, _ = Organization.objects.get_or_create(slug="bench-provider",
                                                  defaults={"name": "bench", "is_provider": True})
    Fabric.objects.filter(name__startswith="bench-").delete()

    print("-- 3-tier fat-tree, 12,500 nodes x 8 GPUs (100,000 GPUs), radix 64")
    spec = timed("generate", lambda: fat_tree(12_500, 64, tiers=3))
    timed("generate + save to PostgreSQL (first import)", lambda: services.save_fabric(
        owner=owner, name="bench-ft", spec=fat_tree(12_500, 64, tiers=3), source="generator"))
    fabric = Fabric.objects.get(name="bench-ft")
    print(f"   rows: {Host.objects.filter(fabric=fabric).count()} hosts, "
          f"{Link.objects.filter(fabric=fabric).count()} links, "
          f"{Port.objects.filter(fabric=fabric).count()} ports")
    timed("save again (re-import in place)", lambda: services.save_fabric(
        owner=owner, name="bench-ft", spec=spec, source="generator"))
    snapshot = timed("snapshot from the database", lambda: load_snapshot(fabric))
    print(f"   snapshot: {len(snapshot.nodes)} nodes, {len(snapshot.domains('leaf'))} leaves")

    print("-- import a 10,000-node topology.conf (parse + save, one transaction)")
    text = export_slurm_tree(fat_tree(10_000, 64, tiers=3))
    print(f"   file: {len(text.splitlines())} lines, {len(text)} bytes")
    timed("import_fabric_file", lambda: services.import_fabric_file(
        owner=owner, name="bench-slurm", text=text, fmt="slurm", path="topology.conf"))

    Fabric.objects.filter(name__startswith="bench-").delete()


if __name__ == "__main__":
    main()

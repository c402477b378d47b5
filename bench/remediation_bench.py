"""One remediation pass over many broken leases, in a scratch database.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ibex python bench/remediation_bench.py \
        [--leases 1000] [--nodes 512]

Creates the database `<name of DATABASE_URL>_remediation_bench` (dropped again at the end),
migrates it, registers a verified provider with a 2-tier fat-tree (16 nodes of 8 H100s a leaf),
prices every GPU, and gives one tenant `--leases` on-demand leases of 2 GPUs, each required in
one leaf, two a node (so every leaf has room for replacements); they are bound and activated
as the scheduler does. Then one GPU of every lease fails, and one pass of
`scheduler.moves.remediation.remediate_leases` is timed (the beat runs it every 15 s), with its
query count. Prints moved / degraded counts.
"""

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

import psycopg  # noqa: E402


def scratch_url(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_remediation_bench"
    admin = urlunsplit(parts._replace(path="/postgres"))
    return admin, name, urlunsplit(parts._replace(path=f"/{name}"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--leases", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=512)
    parser.add_argument("--profile", action="store_true", help="print where the pass spends")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("set DATABASE_URL to a PostgreSQL server (a scratch database is made there)")
    admin, name, url = scratch_url(os.environ["DATABASE_URL"])
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = url
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def run(args):
    import django

    django.setup()
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from fabric import services as fabric_services
    from fabric.core import generators
    from ibex.accounts import services as accounts
    from market import leasing, prices
    from market.models import Allocation, Lease, Order
    from pool import services as pool
    from pool.models import Binding, Gpu, Node
    from scheduler import placing as scheduler
    from scheduler.moves import remediation

    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    provider = accounts.create_organization(slug="bench-provider", roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="bench",
                                   reason="bench")
    spec = generators.fat_tree(args.nodes, 32, tiers=2, prefix="rb-")
    fabric_services.save_fabric(owner=provider, name="bench", spec=spec, source="generator")
    pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
        hostname=h, fabric="bench", gpu_model="H100-80GB", gpu_count=8, cpu_cores=64,
        memory_gib=1024) for h in spec.hosts])
    Node.objects.update(state="active")
    Gpu.objects.filter(node__provider=provider).update(health="ok")  # first heartbeats
    prices.set_prices(provider=provider, scope={"fabric": "bench"}, price_micros=2_000_000,
                      actor="bench")
    tenant = accounts.create_organization(slug="bench-tenant", roles=("tenant",))
    # Two 2-GPU leases a node (GPUs 0-1 and 2-3), so every leaf keeps half its GPUs free:
    # room for the replacements. Leases and their orders are written directly (a bench
    # shortcut for the order path, which bench/order_to_active_bench.py measures).
    now = timezone.now()
    gpus = {(node, index): gpu for gpu, node, index in Gpu.objects.values_list(
        "id", "node_id", "index")}
    slots = [(node, first) for node in Node.objects.order_by("pk").values_list("pk", flat=True)
             for first in (0, 2)][:args.leases]
    for node, first in slots:
        lease = leasing.create_lease(
            tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
            gpus=[leasing.GpuChoice(gpus[(node, first + i)], 2_000_000) for i in range(2)],
            starts_at=now, ends_at=now + timedelta(hours=4), price_micros=2_000_000,
            max_price_micros=3_000_000, locality={"leaves": 1, "spines": 1, "max_hops": 0},
            actor="bench")
        Order.objects.create(tenant=tenant, gpu_models=["H100-80GB"], gpus=2, hours=4,
                             tier="on_demand", max_price_micros=3_000_000,
                             topology={"required": "leaf"}, state="filled", lease=lease)
        scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.update(acknowledged_at=now)
    scheduler.activate_acknowledged_leases()
    active = Lease.objects.filter(state="active").count()
    # one GPU of every lease fails (a bench shortcut for the heartbeats that would say so)
    first_gpus = {}
    for lease_id, gpu_id in Allocation.objects.order_by("gpu_id").values_list("lease_id",
                                                                              "gpu_id"):
        first_gpus.setdefault(lease_id, gpu_id)
    Gpu.objects.filter(pk__in=list(first_gpus.values())).update(health="failed")
    print(f"setup: {active} active leases on {args.nodes} nodes, "
          f"{len(first_gpus)} broken, {time.perf_counter() - started:.1f} s")

    queries = []

    def count(execute, sql, params, many, context):
        queries.append(sql)
        return execute(sql, params, many, context)

    profile = cProfile.Profile() if args.profile else None
    with connection.execute_wrapper(count):
        began = time.perf_counter()
        if profile:
            profile.enable()
        outcome = remediation.remediate_leases()
        elapsed = time.perf_counter() - began
        if profile:
            profile.disable()
            pstats.Stats(profile).sort_stats("cumulative").print_stats(25)
    moved = sum(1 for v in outcome.values() if v == "moved")
    print(f"one remediation pass over {len(outcome)} broken leases: {elapsed:.2f} s "
          f"({moved} moved, {len(outcome) - moved} degraded), {len(queries)} queries, "
          f"{elapsed / max(len(outcome), 1) * 1000:.1f} ms a lease")
    began = time.perf_counter()
    again = remediation.remediate_leases()
    print(f"the next pass (only the degraded are left): {time.perf_counter() - began:.2f} s "
          f"over {len(again)} leases")


if __name__ == "__main__":
    main()

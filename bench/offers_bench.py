"""`GET /api/v1/offers/` over 100,000 GPUs, in a scratch database.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ibex python bench/offers_bench.py [--runs 7]

Creates the database `<name of DATABASE_URL>_offers_bench` (dropped again at the end),
migrates it, and seeds two verified providers with the bulk helpers the other benches use
(`fabric.services.save_fabric`, `pool.services.register_nodes`, `market.prices.set_prices`):
a 3-tier fat-tree of 12,000 H100 nodes (radix 64) and one of 500 A100 nodes, 8 GPUs each
(100,000 GPUs). Prices vary by leaf (2.00-2.95), every fourth leaf is shareable, about 30 %
of the GPUs are held by leases (whole nodes and single GPUs, written as allocations directly,
a bench shortcut), and 200 nodes have an unreachable spell in the last 30 days. Then each
query is timed through `market.offers.find_offers` (parse + both SQL statements), median of
`--runs`, and printed with its result count.
"""

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

import psycopg  # noqa: E402

QUERIES = [
    ("all free capacity by model", {}),
    ("64 H100s under 2.50, 16 in a leaf, by model and fabric",
     {"q": "model=H100-80GB gpus>=64 price<=2.50 leaf_free>=16", "group_by": "model,fabric"}),
    ("by leaf and provider, most free first", {"group_by": "leaf,provider",
                                               "sort": "-leaf_free", "limit": "50"}),
    ("reliable providers only", {"q": "reliability>=0.99 model in [H100-80GB,A100-80GB]"}),
    ("MIG slices 3g.40gb", {"q": "mig_profile=3g.40gb", "group_by": "leaf"}),
    ("shares of 250 (free and shared GPUs)", {"q": "share>=250", "group_by": "provider"}),
]


def scratch_url(url: str) -> tuple[str, str, str]:
    parts = urlsplit(url)
    name = parts.path.lstrip("/") + "_offers_bench"
    admin = urlunsplit(parts._replace(path="/postgres"))
    return admin, name, urlunsplit(parts._replace(path=f"/{name}"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch database (and reuse one kept before)")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL"):
        sys.exit("set DATABASE_URL to a PostgreSQL server (a scratch database is made there)")
    admin, name, url = scratch_url(os.environ["DATABASE_URL"])
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                              (name,)).fetchone()
        args.reuse = bool(exists) and args.keep
        if not args.reuse:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = url
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


def seed_provider(slug, fabric, nodes, gpu_model, prefix):
    from fabric import services as fabric_services
    from fabric.core import generators
    from ibex.accounts import services as accounts
    from pool import services as pool

    provider = accounts.create_organization(slug=slug, roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="bench",
                                   reason="bench")
    spec = generators.fat_tree(nodes, 64, tiers=3, prefix=prefix)
    fabric_services.save_fabric(owner=provider, name=fabric, spec=spec, source="generator")
    pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
        hostname=h, fabric=fabric, gpu_model=gpu_model, gpu_count=8, cpu_cores=64,
        memory_gib=1024) for h in spec.hosts])
    return provider


def run(args):
    import django

    django.setup()
    if not args.reuse:
        seed()
    time_queries(args.runs)


def seed():
    from datetime import timedelta

    from django.core.management import call_command
    from django.db import connection
    from django.db.backends.postgresql.psycopg_any import DateTimeTZRange
    from django.utils import timezone

    from ibex.accounts import services as accounts
    from market import prices
    from market.models import Allocation, Lease
    from pool import services as pool
    from pool.models import Gpu, HealthEvent, Node

    rng = random.Random(1)
    started = time.perf_counter()
    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    big = seed_provider("bench-hpc", "bench-h100", 12_000, "H100-80GB", "h-")
    small = seed_provider("bench-budget", "bench-a100", 500, "A100-80GB", "a-")
    Node.objects.update(state="active", created_at=timezone.now() - timedelta(days=60))
    Gpu.objects.update(health="ok")  # the first heartbeats
    for provider, fabric in ((big, "bench-h100"), (small, "bench-a100")):
        prices.set_prices(provider=provider, scope={"fabric": fabric}, price_micros=2_500_000,
                          actor="bench")
        leaves = sorted(set(Node.objects.filter(fabric__name=fabric)
                            .values_list("host__leaf", flat=True)))
        for n, leaf in enumerate(leaves):
            prices.set_prices(provider=provider, scope={"leaf": leaf},
                              price_micros=2_000_000 + 50_000 * (n % 20), actor="bench",
                              shareable=(n % 4 == 0))
    seeded = time.perf_counter() - started
    # ~30 % held: 20 % of nodes whole, 10 % of the rest one GPU each, for the next 4 hours
    tenant = accounts.create_organization(slug="bench-tenant", roles=("tenant",))
    now = timezone.now()
    period = DateTimeTZRange(now - timedelta(minutes=5), now + timedelta(hours=4))
    nodes = list(Node.objects.values_list("pk", flat=True))
    gpus_by_node = {}
    for gpu_id, node_id in Gpu.objects.values_list("pk", "node_id"):
        gpus_by_node.setdefault(node_id, []).append(gpu_id)
    held = []
    for node_id in nodes:
        draw = rng.random()
        if draw < 0.33:
            held += gpus_by_node[node_id]
        elif draw < 0.6:
            held += gpus_by_node[node_id][:rng.randint(1, 7)]
    lease = Lease.objects.create(tenant=tenant, tier="on_demand", gpu_model="H100-80GB",
                                 gpu_count=len(held), price_micros=1, max_price_micros=1,
                                 starts_at=period.lower, ends_at=period.upper, state="active")
    Allocation.objects.bulk_create([Allocation(lease=lease, gpu_id=g, period=period,
                                               price_micros=1) for g in held],
                                   batch_size=5000)
    events = []
    for node_id in rng.sample(nodes, 200):
        at = now - timedelta(days=rng.uniform(1, 29))
        events += [HealthEvent(node_id=node_id, kind="node_unreachable",
                               from_value="reachable", to_value="unreachable"),
                   HealthEvent(node_id=node_id, kind="node_reachable",
                               from_value="unreachable", to_value="reachable")]
    HealthEvent.objects.bulk_create(events)
    for event, at in zip(HealthEvent.objects.order_by("pk"), [
            now - timedelta(days=d) + timedelta(hours=h)
            for d in [rng.uniform(1, 29) for _ in range(200)] for h in (0, rng.uniform(1, 12))],
            strict=True):
        HealthEvent.objects.filter(pk=event.pk).update(at=at)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"seeded {Gpu.objects.count():,} GPUs on {Node.objects.count():,} nodes, "
          f"{len(held):,} held, in {time.perf_counter() - started:.0f} s "
          f"(inventory and prices {seeded:.0f} s)")


def time_queries(runs: int):
    from django.core.cache import cache

    from market import offers
    from market.core.offers_query import parse_offers_query
    from pool.reliability import CACHE_KEY

    cache.delete(CACHE_KEY)  # measured in another database (the tests') with this Redis

    for label, params in QUERIES:
        times, answer = [], None
        for _ in range(runs):
            begin = time.perf_counter()
            answer = offers.find_offers(parse_offers_query(**params))
            times.append((time.perf_counter() - begin) * 1000)
        print(f"{label}: median {statistics.median(times):.0f} ms "
              f"(min {min(times):.0f}, max {max(times):.0f}); {answer['count']} groups, "
              f"first {answer['results'][0] if answer['results'] else None}")


if __name__ == "__main__":
    main()

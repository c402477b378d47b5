"""A Slurm gateway's report of a whole cluster, as the server takes it, in a scratch database.

    DATABASE_URL=postgresql://postgres@127.0.0.1:5432/ibex REDIS_URL=redis://127.0.0.1:6379/0 \
        python bench/gateway_heartbeat_bench.py [--nodes 256 1024] [--reports 5]

Creates the database `<name of DATABASE_URL>_gateway_bench` (dropped again at the end),
migrates it, registers a verified provider with a 2-tier fat-tree of `--nodes` nodes of 8 H100s
(16 a leaf up to 512 nodes, 32 beyond), and for each size times `scheduler.gateway.record_gateway_heartbeat` (what
`POST /api/v1/gateway/heartbeat/` runs, without HTTP) over `--reports` reports in a row:

- steady: every node healthy, nothing changed since the last report (the common case);
- churn: 5 % of the nodes have a GPU busy with a Slurm job, a different 5 % each report, and one
  node is drained then resumed.

Prints per size and case: median and worst seconds per report and queries per report. One
8-GPU lease ref is bound on each of 10 % of the nodes (their bindings are read and reconciled
each report; the refs name no lease, so no reservation is answered).
"""

import argparse
import os
import statistics
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
    name = parts.path.lstrip("/") + "_gateway_bench"
    admin = urlunsplit(parts._replace(path="/postgres"))
    return admin, name, urlunsplit(parts._replace(path=f"/{name}"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--reports", type=int, default=5)
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
    from django.core.management import call_command
    from django.db import connection

    from fabric import services as fabric_services
    from fabric.core import generators
    from ibex.accounts import services as accounts
    from pool import services as pool
    from pool.models import Node
    from scheduler.gateway import NodeReport, record_gateway_heartbeat

    call_command("migrate", verbosity=0)
    pool.ensure_gpu_catalogue()
    print(f"{'nodes':>6} {'case':<7} {'median s':>9} {'worst s':>8} {'queries':>8}")
    for size in args.nodes:
        slug = f"bench-{size}"
        provider = accounts.create_organization(slug=slug, roles=("provider",))
        accounts.change_provider_state(organization=provider, to_state="verified",
                                       actor="bench", reason="bench")
        spec = generators.fat_tree(size, 32 if size <= 512 else 64, tiers=2, prefix=f"g{size}-")
        fabric_services.save_fabric(owner=provider, name=slug, spec=spec, source="slurm")
        pool.register_nodes(provider=provider, specs=[pool.NodeSpec(
            hostname=h, fabric=slug, gpu_model="H100-80GB", gpu_count=8, cpu_cores=64,
            memory_gib=1024) for h in spec.hosts])
        hosts = sorted(spec.hosts)
        nodes = {n.hostname: n for n in Node.objects.filter(provider=provider)}
        leased = hosts[::10]
        pool.set_lease_bindings(
            wanted={f"L-{900_000 + i}": {nodes[h].pk: list(range(8))}
                    for i, h in enumerate(leased)},
            launches={})

        def reports(churn: int | None, hosts=hosts) -> list[NodeReport]:
            out = []
            for i, host in enumerate(hosts):
                busy = {3: "job 1 of alice"} if churn is not None and \
                    (i + churn) % 20 == 0 else {}
                down = "DRAIN: bench" if churn is not None and churn % 2 and i == 1 else ""
                out.append(NodeReport(hostname=host, gpus=list(range(8)), down=down, busy=busy))
            return out

        record_gateway_heartbeat(provider=provider, fabric_name=slug, kind="slurm",
                                 status="ok", nodes=reports(None), refused=[])  # first report
        for case in ("steady", "churn"):
            times, counts = [], []
            for step in range(args.reports):
                queries = []

                def count(execute, sql, params, many, context, queries=queries):
                    queries.append(sql)
                    return execute(sql, params, many, context)

                body = reports(None if case == "steady" else step)
                with connection.execute_wrapper(count):
                    began = time.perf_counter()
                    record_gateway_heartbeat(
                        provider=provider, fabric_name=slug, kind="slurm", status="ok",
                        nodes=body, refused=[])
                    times.append(time.perf_counter() - began)
                counts.append(len(queries))
            print(f"{size:>6} {case:<7} {statistics.median(times):>9.3f} {max(times):>8.3f} "
                  f"{statistics.median(counts):>8.0f}")


if __name__ == "__main__":
    main()

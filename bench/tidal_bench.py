"""A tidal switch of 80 % of a 2,048-GPU private pool, in real time.

    python bench/tidal_bench.py [--nodes 256] [--notice 10]

At night training holds 1,640 GPUs (205 leases of 8) and inference 408 (51 leases); 154
inference orders of 8 GPUs are queued. At T0 the day step moves the split to training 408 /
inference 1,640: 154 training leases get the preemption notice, and the loop below does what
beat does (end preempted leases, admission pass), once a second, until the `TidalRun` is in
force. Reports the time to in force, the notice, and the scheduling time (the rest).
It builds its own provider, 256-node fabric and pool (named `bench-tidal-<time>`) and
leaves them in place.
"""

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BASE_DIR))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")

parser = argparse.ArgumentParser()
parser.add_argument("--nodes", type=int, default=256)
parser.add_argument("--notice", type=int, default=10, help="preemption notice, seconds")
args = parser.parse_args()
os.environ["PREEMPTION_NOTICE_S"] = str(args.notice)

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from fabric import services as fabric_services  # noqa: E402
from fabric.core import generators  # noqa: E402
from ibex.accounts import services as accounts  # noqa: E402
from market import auctions, leasing, orders  # noqa: E402
from market.models import Lease, Order  # noqa: E402
from pool import quotas  # noqa: E402
from pool import services as pool_services  # noqa: E402
from pool.models import Gpu, Node, Pool, TidalRun, TidalStep  # noqa: E402
from scheduler.pools import admission, tides  # noqa: E402

H100 = "H100-80GB"


def order(tenant, pool, queue, gpus=8):
    return orders.place_order(tenant=tenant, actor="bench", request=orders.OrderRequest(
        gpu_models=[H100], gpus=gpus, hours=24, tier="on_demand", max_price_micros=0,
        pool=pool.name, queue=queue))


def main():
    call_command("migrate", verbosity=0)
    pool_services.ensure_gpu_catalogue()
    stamp = int(time.time())
    name = f"bench-tidal-{stamp}"
    provider = accounts.create_organization(slug=name, roles=("provider",))
    accounts.change_provider_state(organization=provider, to_state="verified", actor="bench",
                                   reason="bench")
    spec = generators.fat_tree(args.nodes, 32, tiers=2, prefix=f"tide{stamp}-")
    fabric_services.save_fabric(owner=provider, name=name, spec=spec, source="generator")
    pool_services.register_nodes(provider=provider, specs=[pool_services.NodeSpec(
        hostname=h, fabric=name, gpu_model=H100, gpu_count=8, cpu_cores=64,
        memory_gib=1024) for h in spec.hosts])
    Node.objects.filter(provider=provider).update(state="active")  # as heartbeats would
    Gpu.objects.filter(node__provider=provider).update(health="ok")  # first heartbeats
    operator = accounts.create_organization(slug=f"{name}-ops", roles=("operator",))
    company = accounts.create_organization(slug=f"{name}-co", roles=("tenant",))
    pool = Pool.objects.create(name=name, owner=operator)
    pool.nodes.set(Node.objects.filter(provider=provider))
    total = args.nodes * 8
    big, small = total * 80 // 100 // 8 * 8, total - total * 80 // 100 // 8 * 8
    quotas.define_quota_node(pool=pool, name="company", organization=company)
    for queue, nominal in (("training", big), ("inference", small)):
        quotas.define_quota_node(pool=pool, name=queue, parent="company", organization=company,
                                 quotas=[quotas.QuotaSpec(H100, nominal, 0)])
    now = datetime.now(UTC)
    TidalStep.objects.create(pool=pool, name="day", at=now + timedelta(days=1),
                             nominals={"training": {H100: small}, "inference": {H100: big}})
    for queue, nominal in (("training", big), ("inference", small)):
        for _ in range(nominal // 8):
            order(company, pool, queue)
    admission.admit_pool(pool_id=pool.pk)
    for lease in Lease.objects.filter(quota_node__pool=pool, state="pending"):
        lease = leasing.change_lease_state(lease=lease, to_state="placing", actor="bench",
                                           reason="bench")
        leasing.change_lease_state(lease=lease, to_state="active", actor="bench",
                                   reason="bench")
    waiting = [order(company, pool, "inference") for _ in range((big - small) // 8)]
    admission.admit_pool(pool_id=pool.pk)
    print(f"night: {Lease.objects.filter(quota_node__pool=pool, state='active').count()} "
          f"active leases on {total} GPUs, {len(waiting)} inference orders queued", flush=True)

    TidalStep.objects.filter(pool=pool).update(at=timezone.now())
    started = time.perf_counter()
    runs = tides.apply_due_steps()
    applied = time.perf_counter() - started
    run = runs[0]
    scheduling = applied
    passes = 0
    while True:
        time.sleep(1)
        tick = time.perf_counter()
        auctions.end_preempted_leases()
        admission.admit_pool(pool_id=pool.pk)
        scheduling += time.perf_counter() - tick
        passes += 1
        run = TidalRun.objects.get(pk=run.pk)
        if run.in_force_at is not None or passes > args.notice + 600:
            break
    in_force = time.perf_counter() - started
    filled = Order.objects.filter(pk__in=[o.pk for o in waiting], state="filled").count()
    print(f"day switch: {run.gpus_to_give_way} GPUs gave way ({run.leases_preempted} leases "
          f"preempted, {run.gpus_to_give_way * 100 / total:.0f} % of {total}); "
          f"{filled}/{len(waiting)} inference orders filled; in force after {in_force:.1f} s "
          f"= notice {args.notice} s + {in_force - args.notice:.1f} s (of which scheduling "
          f"work {scheduling:.1f} s: apply step {applied:.2f} s, {passes} beat passes)",
          flush=True)


if __name__ == "__main__":
    main()

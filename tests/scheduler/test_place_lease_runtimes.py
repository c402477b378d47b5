"""A lease re-placed before binding (its GPUs no longer offered) goes only on nodes whose agent
can run what it asks, even when a node that runs nothing is cheaper."""

from billing import services as money
from market import prices
from market.models import Allocation, Lease
from pool.models import Gpu, Node
from scheduler import placing as scheduler
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes


def test_a_workload_lease_re_placed_skips_cheaper_nodes_that_run_nothing(db):
    provider = provider_with_nodes(nodes=4)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=1_000_000,
                      actor="t")
    first, second, _, _ = Node.objects.order_by("hostname")
    Node.objects.filter(pk__in=[first.pk, second.pk]).update(runtime="process")
    prices.set_prices(provider=provider, scope={"node": second.hostname}, price_micros=2_000_000,
                      actor="t")  # dearer than the nodes that run nothing
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    body = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00", "workload": {"command": ["python3", "train.py"]}},
        format="json").json()
    lease = Lease.objects.get(pk=body["lease"])
    assert set(Allocation.objects.filter(lease=lease).values_list(
        "gpu__node_id", flat=True)) == {first.pk}
    Gpu.objects.filter(node=first, index=0).update(health="failed")

    scheduler.place_lease(lease_id=lease.pk)

    lease.refresh_from_db()
    assert lease.state == "placing"
    assert set(Allocation.objects.filter(lease=lease, gpu__health="ok").values_list(
        "gpu__node_id", flat=True)) == {second.pk}

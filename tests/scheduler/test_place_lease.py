from datetime import timedelta

from django.utils import timezone

from market import prices
from market import services as money
from market.models import Hold, Lease
from pool.models import Binding, Node
from scheduler import services as scheduler
from tests.factories import client_for, make_org
from tests.market.inventory import provider_with_nodes


def won_lease() -> tuple[Lease, object]:
    provider = provider_with_nodes(nodes=2)
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="t")
    tenant = make_org("acme-ai", "tenant")
    money.grant_credit(organization=tenant, amount_micros=100_000_000, reason="t", actor="t")
    body = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 16, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "2.00"}, format="json").json()
    return Lease.objects.get(pk=body["lease"]), tenant


def test_a_lease_is_bound_on_every_node_it_uses(db):
    lease, _ = won_lease()

    scheduler.place_lease(lease_id=lease.pk)

    bindings = list(Binding.objects.filter(lease_ref=f"L-{lease.pk}"))
    assert len(bindings) == 2 and len({b.node_id for b in bindings}) == 2
    assert all(b.gpu_indexes == list(range(8)) for b in bindings)


def test_a_lease_no_agent_acknowledges_fails_after_the_timeout_and_costs_nothing(db, settings):
    settings.PLACING_TIMEOUT_S = 300
    lease, tenant = won_lease()
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.filter(node__hostname__endswith="1").update(acknowledged_at=timezone.now())

    assert scheduler.fail_stuck_leases(now=timezone.now()) == []
    failed = scheduler.fail_stuck_leases(now=timezone.now() + timedelta(seconds=301))

    lease.refresh_from_db()
    assert failed == [lease.pk]
    assert lease.state == "failed"
    assert "no acknowledgement from" in lease.events.get(to_state="failed").reason
    assert Hold.objects.get().state == "closed"
    assert money.balances_of(tenant).held_micros == 0
    assert not Binding.objects.filter(serve=True).exists()  # the nodes are told to stop

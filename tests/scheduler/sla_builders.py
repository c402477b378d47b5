"""Builders for SLA, event and webhook tests: a priced provider, a funded tenant, leases won
through on-demand orders and activated by the scheduler, health events at chosen times."""

from datetime import datetime, timedelta

from django.db.backends.postgresql.psycopg_any import DateTimeTZRange

from billing import services as money
from market import leasing, metering, orders, prices
from market.models import Allocation, Lease, LeaseEvent
from pool.models import Binding, Gpu, HealthEvent, Node
from scheduler import placing as scheduler
from tests.factories import make_org
from tests.market.inventory import gpus_of, provider_with_nodes

PRICE = 2_500_000  # $2.50 per GPU-hour
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def priced_provider():
    provider = provider_with_nodes(nodes=4)  # 32 GPUs: 2 leaves of 2 nodes of 8 GPUs
    Node.objects.update(state="active")
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=PRICE,
                      actor="test")
    return provider


def funded_tenant(slug="acme-ai"):
    tenant = make_org(slug, "tenant")
    money.grant_credit(organization=tenant, amount_micros=1_000 * 1_000_000, reason="test",
                       actor="test")
    return tenant


def won_lease(tenant, *, gpus=8, hours=10, tier="on_demand") -> Lease:
    """A lease won by an on-demand order (the way tenants buy), pending placement."""
    order = orders.place_order(tenant=tenant, actor=tenant.slug, request=orders.OrderRequest(
        gpu_models=["H100-80GB"], gpus=gpus, hours=hours, tier="on_demand",
        max_price_micros=3_000_000))
    lease = Lease.objects.get(pk=order.lease_id)
    if tier != "on_demand":  # reserved and spot come from auctions; only the tier matters here
        Lease.objects.filter(pk=lease.pk).update(tier=tier)
        lease.refresh_from_db()
    return lease


def activate(lease: Lease, *, after_s: int = 0) -> Lease:
    """Bind, acknowledge and activate the lease; then pin its history to the lease's start:
    won at `starts_at`, active `after_s` seconds later (times the test can reason about)."""
    scheduler.place_lease(lease_id=lease.pk)
    Binding.objects.filter(lease_ref=f"L-{lease.pk}").update(acknowledged_at=lease.starts_at)
    assert scheduler.activate_acknowledged_leases() == [lease.pk]
    LeaseEvent.objects.filter(lease=lease).update(at=lease.starts_at)
    LeaseEvent.objects.filter(lease=lease, to_state="active").update(
        at=lease.starts_at + timedelta(seconds=after_s))
    return Lease.objects.get(pk=lease.pk)


def end(lease: Lease, at: datetime, to_state="terminated") -> Lease:
    """End the lease, then pin the end (and where its allocations were cut) to `at`."""
    leasing.change_lease_state(lease=lease, to_state=to_state, actor="test", reason="test")
    LeaseEvent.objects.filter(lease=lease, to_state=to_state).update(at=at)
    Allocation.objects.filter(lease=lease).update(period=DateTimeTZRange(lease.starts_at, at))
    Lease.objects.filter(pk=lease.pk).update(state_changed_at=at)
    return Lease.objects.get(pk=lease.pk)


def lease_gpus(lease: Lease) -> list[Gpu]:
    return list(Gpu.objects.filter(allocations__lease=lease).select_related("node")
                .order_by("node__hostname", "index"))


def gpu_health(gpu: Gpu, to_value: str, at: datetime, from_value="ok") -> HealthEvent:
    event = HealthEvent.objects.create(node=gpu.node, gpu=gpu, kind="gpu_health",
                                       from_value=from_value, to_value=to_value, detail="test")
    HealthEvent.objects.filter(pk=event.pk).update(at=at)
    return event


def node_reachability(node: Node, reachable: bool, at: datetime) -> HealthEvent:
    kind, values = (("node_reachable", ("unreachable", "reachable")) if reachable
                    else ("node_unreachable", ("reachable", "unreachable")))
    event = HealthEvent.objects.create(node=node, kind=kind, from_value=values[0],
                                       to_value=values[1], detail="test")
    HealthEvent.objects.filter(pk=event.pk).update(at=at)
    return event


def meter(lease: Lease, minutes: int) -> None:
    """Bill the lease's first `minutes` whole minutes the way the metering beat does."""
    first = (lease.starts_at + MINUTE).replace(second=0, microsecond=0)
    for k in range(minutes):
        metering.meter_minute(minute=first + k * MINUTE)


__all__ = ["gpus_of"]

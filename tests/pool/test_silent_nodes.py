"""A node whose agent has gone silent is not chosen for new placements: its GPUs are offered
only while its last heartbeat is at most one interval (plus HEARTBEAT_GRACE_S) old."""

from datetime import timedelta

from django.conf import settings

from pool import services
from pool.models import Node
from tests.pool.conftest import heartbeat


def offered(node_id, **kwargs):
    return services.offered_gpus(**kwargs).filter(node_id=node_id).count()


def test_a_node_that_beat_within_its_interval_and_grace_is_offered(registered, verified):
    node_id, token = registered
    heartbeat(node_id, token)
    beat = Node.objects.get(pk=node_id).last_heartbeat_at

    assert offered(node_id, now=beat + timedelta(seconds=15 + settings.HEARTBEAT_GRACE_S)) == 8


def test_a_node_silent_past_its_interval_and_grace_is_not_offered(registered, verified,
                                                                    time_machine):
    node_id, token = registered
    heartbeat(node_id, token)
    later = Node.objects.get(pk=node_id).last_heartbeat_at + timedelta(
        seconds=15 + settings.HEARTBEAT_GRACE_S + 1)

    assert offered(node_id, now=later) == 0  # long before it is unreachable (3 intervals)
    time_machine.move_to(later, tick=False)
    heartbeat(node_id, token)
    assert offered(node_id, now=later) == 8


def test_an_order_is_not_placed_on_a_silent_node(registered, verified, provider, tenant,
                                                 time_machine):
    from market import prices
    from market.models import Order
    from tests.factories import client_for, fund

    node_id, token = registered
    heartbeat(node_id, token)
    prices.set_prices(provider=provider, scope={"fabric": "lab"}, price_micros=2_000_000,
                      actor="test")
    fund(tenant, "100.00")
    time_machine.move_to(Node.objects.get(pk=node_id).last_heartbeat_at + timedelta(
        seconds=15 + settings.HEARTBEAT_GRACE_S + 6), tick=False)

    response = client_for(tenant).post("/api/v1/orders/", {
        "gpu_models": ["H100-80GB"], "gpus": 8, "hours": 1, "tier": "on_demand",
        "max_price_per_gpu_hour": "3.00"}, format="json")

    assert response.status_code in (201, 409)
    assert not Order.objects.filter(state="filled").exists()

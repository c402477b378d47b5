"""The order's state machine: the one way an order changes state, and giving back its hold.

Intake (`orders`), private pools (`pool_orders`) and auctions (`auctions`) all move orders
through `change_order_state`; the caller holds the order's row lock.
"""

from __future__ import annotations

from django.utils import timezone

from billing import services as money
from billing.models import Hold
from market.models import Order, OrderEvent

OS = Order.State
ORDER_TRANSITIONS = {
    OS.OPEN: {OS.FILLED, OS.RESTING, OS.REFUSED, OS.CANCELLED, OS.QUEUED},
    OS.QUEUED: {OS.FILLED, OS.CANCELLED},
    OS.RESTING: {OS.FILLED, OS.CANCELLED, OS.EXPIRED},
    OS.FILLED: set(),
    OS.REFUSED: set(),
    OS.CANCELLED: set(),
    OS.EXPIRED: set(),
}


class OrderError(Exception):
    """A refused order: `field` names bad input; `code` says how the API answers."""

    def __init__(self, message: str, *, field: str | None = None, code: str = "invalid"):
        super().__init__(message)
        self.message, self.field, self.code = message, field, code


def order_ref(order: Order) -> str:
    """The hold's name for an order's money."""
    return f"order-{order.pk}"


def change_order_state(order: Order, to_state: str, *, actor: str, reason: str) -> Order:
    if to_state not in ORDER_TRANSITIONS[order.state]:
        raise OrderError(f"a {order.state} order cannot become {to_state}", code="invalid_state")
    OrderEvent.objects.create(order=order, from_state=order.state, to_state=to_state,
                              actor=actor, reason=reason)
    order.state, order.reason, order.state_changed_at = to_state, reason, timezone.now()
    order.save(update_fields=["state", "reason", "state_changed_at", "lease"])
    return order


def release_order_hold(order: Order, *, actor: str, reason: str) -> None:
    """Give back what the order's hold did not capture."""
    hold = Hold.objects.filter(order_ref=order_ref(order)).first()
    if hold is not None:
        money.release_hold(hold=hold, actor=actor, reason=reason)

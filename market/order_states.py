"""The order's state machine: the one way an order changes state, and giving back its hold.

Intake (`orders`), private pools (`pool_orders`) and auctions (`auctions`) all move orders
through `change_order_state`; the caller holds the order's row lock.
"""

from __future__ import annotations

from billing import services as money
from billing.models import Hold
from ibex.errors import Refusal
from ibex.statemachine import StateMachine, transition
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


class OrderError(Refusal):
    """A refused order: `field` names bad input; `code` says how the API answers."""


def order_ref(order: Order) -> str:
    """The hold's name for an order's money."""
    return f"order-{order.pk}"


ORDER_MACHINE = StateMachine(
    name="order", transitions=ORDER_TRANSITIONS,
    refusal=lambda message: OrderError(message, code="invalid_state"),
    history=OrderEvent, history_of=lambda order: {"order": order})


def change_order_state(order: Order, to_state: str, *, actor: str, reason: str) -> Order:
    """The one way an order changes state; its reason and lease are saved with it."""
    return transition(ORDER_MACHINE, order, to_state, actor=actor, reason=reason,
                      also={"reason": reason, "lease": order.lease})


def release_order_hold(order: Order, *, actor: str, reason: str) -> None:
    """Give back what the order's hold did not capture."""
    hold = Hold.objects.filter(order_ref=order_ref(order)).first()
    if hold is not None:
        money.release_hold(hold=hold, actor=actor, reason=reason)

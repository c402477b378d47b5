"""The IBEX client: `from ibex_client import Client`; the `ibex` command is `ibex_client.cli`.

`requests` and the standard library only; nothing of the IBEX server.
"""

from ibex_client.client import Client, new_idempotency_key
from ibex_client.errors import ApiError
from ibex_client.models import (
    Alternative,
    Balance,
    Event,
    Invoice,
    Lease,
    LogPage,
    Node,
    Offer,
    Order,
    Quote,
    TopUp,
)

__all__ = ["Alternative", "ApiError", "Balance", "Client", "Event", "Invoice", "Lease", "LogPage", "Node",
           "Offer", "Order", "Quote", "TopUp", "new_idempotency_key"]

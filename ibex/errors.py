"""One way to refuse: everything a client can be refused is a `Refusal`.

A service raises a subclass of `Refusal` with a message a person can read, a `code` a program
can switch on and, when one input is at fault, the `field` that names it. Every API answers
every refusal the same way (`ibex.api.errors`): 400 naming the field, or the status that
`REFUSAL_STATUS` gives its code. Pages and commands show the message. Plain Python: no Django.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request the exchange will not carry out; nothing has changed."""

    code = "invalid"  # each kind of refusal may set its own default
    field: str | None = None

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.field = field if field is not None else type(self).field

    def __str__(self) -> str:
        return self.message


# How the API answers a refusal by its code; a code not named here is a 400.
REFUSAL_STATUS = {
    "permission_denied": 403,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "invalid_state": 409,
    "gpus_unavailable": 409,
    "insufficient_funds": 409,
    "spend_limit_exceeded": 409,
    "not_refundable": 409,
    "card_payments_not_configured": 409,
    "node_exists": 409,
    "inconsistent_quotas": 409,
}


def http_status(code: str) -> int:
    return REFUSAL_STATUS.get(code, 400)

"""How a lease is named in the rows of apps that know no leases: `L-<id>`.

A node's bindings (`pool`) and the money rows (usage, SLA credits) store a lease by this
reference, because they sit below the market and may not import its models. It lives here, at
the bottom, so every app builds and reads it the same way.
"""


def lease_ref(lease_id: int) -> str:
    return f"L-{lease_id}"


def lease_id_of(ref: str) -> int | None:
    """The lease id in a reference, or None when it names no lease."""
    prefix, _, number = ref.partition("-")
    return int(number) if prefix == "L" and number.isdigit() else None

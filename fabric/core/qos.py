"""Bandwidth classes: what an order asks of the fabric beside its GPUs.

`guaranteed` reserves `gbps_per_gpu` on every link of its routes (admission checks the sum of
guarantees per link); `standard` (the default) and `scavenger` share what is left, scavenger
last. Each class is an InfiniBand service level (SL) that OpenSM's QoS maps to a VL with the
provider's arbitration weights (docs/fabric.md, "Bandwidth classes").
"""

from __future__ import annotations

from decimal import Decimal

GUARANTEED = "guaranteed"
STANDARD = "standard"
SCAVENGER = "scavenger"
CLASSES = (GUARANTEED, STANDARD, SCAVENGER)


def bandwidth_json(bandwidth_class: str, gbps_per_gpu: Decimal | None) -> dict:
    """An order's or lease's class as the API shows it."""
    return {"class": bandwidth_class,
            "gbps_per_gpu": None if gbps_per_gpu is None else float(gbps_per_gpu)}

"""Placement of won leases, binding, preemption and SLA enforcement."""

"""Placing won leases and binding them, moving running ones (remediation, draining,
defragmentation), running private pools, SLA enforcement, the what-if commands and the trace
simulator; the placement engine is the pure `scheduler.core`. It may import every app but
`web`."""

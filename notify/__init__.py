"""Tenant notification: events about a tenant's leases, its webhook endpoints, and the signed
deliveries of those events (with their retries and log); nothing here places or moves a lease.
It may import `market`, `billing`, `pool`, `fabric` and `ibex`; the scheduler, above it, tells
it of SLA credits."""

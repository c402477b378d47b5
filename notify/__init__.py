"""Tenant notification: events about a tenant's leases, its webhook endpoints, and the
signed deliveries of those events to them (with their retries and log).

It sits between the market and the scheduler: it reads leases and health events and is told
of SLA credits by the scheduler; nothing here places or moves a lease.
"""

"""Running private pools: admitting queued orders under the pool's quotas and placing them
(`admission`), the tidal schedules that move quota between queues at set times (`tides`), and
the leases running in a pool as the pure quota core sees them (`running`)."""

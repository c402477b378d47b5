"""Trading: prices, orders (on-demand matching, pool orders), batch auctions, leases and their
state machine, metering; the clearing itself is the pure `market.core`. It may import
`billing`, `pool`, `fabric` and `ibex`; it asks the scheduler for placements only through
`placement_port`."""

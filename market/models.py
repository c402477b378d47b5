"""Asks and prices, orders, auctions, leases and the ledger."""

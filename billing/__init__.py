"""The money: ledger, holds, spend limits, usage, top-ups, refunds, payouts, SLA credits,
invoices and Stripe; `billing.core.money` is the one rule for parsing and rounding amounts.
It may import `pool`, `fabric` and `ibex`, never the market or the scheduler."""

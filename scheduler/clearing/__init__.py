"""`python -m scheduler.clearing`: the market clearing what-if command (see `cli.py`).

It lives in the scheduler, beside `python -m scheduler.placement`, because a clearing needs the
placement engine and the market may not import the scheduler; the clearing itself is
`market.core.clearing`.
"""

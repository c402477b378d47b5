"""`python -m scheduler.placement gang|mig`: the placement what-if command (see `cli.py`).

The engine it runs is `scheduler.core.placement`; this package is only the command.
"""

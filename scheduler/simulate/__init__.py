"""IBEX trace simulator (pure Python, no Django): `python -m scheduler.simulate`.

Replays a workload CSV on a cluster CSV with the production placement engine
(`scheduler.core.placement`) and fabric code (`fabric`). See docs/simulation.md.
"""

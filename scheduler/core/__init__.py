"""The scheduler's pure cores: algorithms over plain data, without Django, Celery or DRF.

`placement` is the topology-aware placement engine, `sla` the measures of a lease's service
level; `clearing_placer` plugs the engine into the market clearing (`market.core.clearing`).
The workers, the what-if commands (`python -m scheduler.placement`, `python -m
scheduler.clearing`), the simulator and the benchmarks run the same code.
"""

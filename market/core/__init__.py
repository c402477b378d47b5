"""The market's pure cores: algorithms over plain data, without Django, Celery or DRF.

`clearing` clears auctions and matches on-demand orders; `whatif` holds what the JSON what-if
commands share (`python -m scheduler.clearing`, `python -m scheduler.placement`). The
simulator, the benchmarks and the workers run the same code.
"""

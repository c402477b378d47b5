"""The scheduler's pure cores: algorithms over plain data, with no Django, Celery or DRF, so
that tests, the simulator and the benchmarks run them without a database."""

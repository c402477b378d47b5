"""Moving leases that are already running: the index of free GPUs a moved lease may take
(`free_gpus`), moving one lease and rebinding its nodes (`one_lease`), and the three passes
built on them: remediation off failed GPUs and silent nodes, draining nodes, and
defragmentation (its database side; the planner is pure, in `scheduler.core.placement.defrag`)."""

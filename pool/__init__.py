"""The pool: nodes, GPUs, GPU models, partitions, health and heartbeats, private pools and
their quotas. It may import `fabric` and `ibex`; it reaches the market and the scheduler only
through the ports they register (`usage_port`, the bindings-acknowledged listener)."""

"""IBEX in front of a Slurm cluster: what the agent reads from Slurm.

Only the pure parsers exist so far (``agent.slurm.scontrol``); the gateway that would run them
against a cluster and report to IBEX (``ibex-agent slurm``) is not built yet. Standard library
and ``fabric.core`` only, like the rest of the agent.
"""

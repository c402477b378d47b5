"""ibex-agent: the IBEX node agent.

It runs on GPU servers, so it stands alone: it imports no Django and nothing from the IBEX
server apps, only the standard library, `requests` and (lazily) `nvidia-ml-py`.
"""

__version__ = "0.1.0"

"""ibex-agent: the IBEX node agent.

It runs on GPU servers, so it stands alone: it imports no Django and nothing from the IBEX
server apps, only the standard library, `requests`, (lazily) `nvidia-ml-py` and fabric's pure
core (`fabric.core`, which imports no Django either), for hostlists.
"""

__version__ = "0.1.0"

"""`python -m agent ...` runs the same command line as `ibex-agent ...`."""

import sys

from agent.cli import main

sys.exit(main())

import sys

from ibex_client.cli import main

sys.exit(main())

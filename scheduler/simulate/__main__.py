import sys

from scheduler.simulate.cli import main

sys.exit(main(sys.argv[1:]))

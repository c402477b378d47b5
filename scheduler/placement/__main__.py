from market.core.whatif import exit_with
from scheduler.placement.cli import main

exit_with(main)

from market.core.whatif import exit_with
from scheduler.clearing.cli import main

exit_with(main)

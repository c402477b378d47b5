from scheduler.placement.cli import entry_point

entry_point()

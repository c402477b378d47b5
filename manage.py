#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ibex.settings")
    from ibex.cli import run_django_command

    sys.exit(run_django_command(sys.argv))


if __name__ == "__main__":
    main()

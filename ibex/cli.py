"""Run a Django command, turning configuration and connection failures into one clear line."""

import sys

from ibex.config import ConfigError
from ibex.runtime import EmbeddedServiceError

DATABASE_HINT = (
    "check DATABASE_URL (postgresql://USER:PASSWORD@HOST:PORT/NAME) and that the server is up, "
    "or unset it to use IBEX's embedded PostgreSQL"
)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def run_django_command(argv: list[str]) -> int:
    try:
        from django.core.management import execute_from_command_line
        from django.db.utils import OperationalError

        try:
            execute_from_command_line(argv)
        except OperationalError as exc:
            print(f"ibex: cannot use PostgreSQL: {one_line(exc)}; {DATABASE_HINT}", file=sys.stderr)
            return 1
    except (ConfigError, EmbeddedServiceError) as exc:
        print(f"ibex: {exc}", file=sys.stderr)
        return 1
    return 0

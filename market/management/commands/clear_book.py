"""`python manage.py clear_book BOOK.json [--time-limit 5]`: clear a book, print the answer.

Reads a book (`market.core.book`, docs/auctions.md), clears it with the welfare-maximising
winner determination (`market.core.winners.clear_welfare`) and prints the clearing as JSON on
stdout. Touches no database, so operators can replay a past clearing and anyone can check
ours. A malformed book: the JSON path of the first error on stderr, exit status 2, nothing on
stdout.
"""

import json
import sys

from django.core.management.base import BaseCommand

from market.core.book import clearing_json, read_book
from market.core.whatif import InvalidInput
from market.core.winners import DEFAULT_TIME_LIMIT_S, clear_welfare


class Command(BaseCommand):
    help = "Clear an auction book (JSON) and print the clearing as JSON; no database."
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser):
        parser.add_argument("book", help="the book: a JSON file, or - for stdin")
        parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                            help="seconds for the clearing (price_to_win not counted)")

    def handle(self, *args, book, time_limit, **options):
        try:
            text = sys.stdin.read() if book == "-" else open(book, encoding="utf-8").read()
        except OSError as error:
            self._refuse(f"{book}: cannot read the book ({error.strerror})")
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            self._refuse(f"input: not valid JSON ({error.msg} at line {error.lineno})")
        if time_limit <= 0:
            self._refuse("--time-limit: must be positive")
        try:
            parsed = read_book(document)
            clearing = clear_welfare(parsed.levels, parsed.nodes, parsed.bids,
                                     time_limit_s=time_limit)
        except InvalidInput as error:
            self._refuse(f"{error.field}: {error.message}")
        self.stdout.write(json.dumps(clearing_json(clearing), indent=2))

    def _refuse(self, message: str) -> None:
        self.stderr.write(message)
        sys.exit(2)

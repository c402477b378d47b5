"""`python manage.py export_book CLEARING_ID [--out FILE]`: write the book a stored clearing
was solved from, in the format `clear_book` reads (docs/auctions.md), so a past clearing can
be replayed: `manage.py export_book 42 | manage.py clear_book -`. The book is the interval's:
every market cleared with it, since a bid over alternatives may span them.
"""

import json
import sys

from django.core.management.base import BaseCommand

from market.models import Clearing


class Command(BaseCommand):
    help = "Write the book (JSON) a stored auction clearing was solved from."

    def add_arguments(self, parser):
        parser.add_argument("clearing", help="the clearing's id (GET /api/v1/markets/M/history/)")
        parser.add_argument("--out", default="-", help="a file to write, or - for stdout")

    def handle(self, *args, clearing, out, **options):
        if not clearing.isdigit():
            self._refuse(f"clearing: {clearing!r} is not a clearing id")
        record = Clearing.objects.filter(pk=int(clearing)).first()
        if record is None:
            self._refuse(f"clearing: no clearing {clearing}")
        if record.book is None:
            self._refuse(f"clearing {clearing} ({record}) kept no book: it cleared no whole-GPU "
                         "bids, or before books were kept")
        text = json.dumps(record.book, indent=2) + "\n"
        if out == "-":
            self.stdout.write(text, ending="")
        else:
            with open(out, "w", encoding="utf-8") as handle:
                handle.write(text)

    def _refuse(self, message: str) -> None:
        self.stderr.write(message)
        sys.exit(2)

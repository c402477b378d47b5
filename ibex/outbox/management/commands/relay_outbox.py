import signal
import time

from django.core.management.base import BaseCommand

from ibex.outbox.services import relay_pending


class Command(BaseCommand):
    help = "Relay outbox messages to the broker, every few seconds, until stopped."

    def add_arguments(self, parser):
        parser.add_argument("--every", type=float, default=2.0)
        parser.add_argument("--once", action="store_true")

    def handle(self, *args, every, once, **options):
        running = [True]
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: running.__setitem__(0, False))
        while running[0]:
            sent = relay_pending()
            if sent:
                self.stdout.write(f"relayed {sent} message(s)")
            if once:
                return
            time.sleep(every)

"""The IBEX project package: settings, URLs, the Celery app, the embedded runtime and the helpers
every app shares (database retries, rate limits, security); accounts, audit, outbox and api below.
It is the bottom of the import arrows: it imports no IBEX app (the URLs name theirs as strings),
and every app may import it."""

from ibex.celery import app as celery_app

__all__ = ["celery_app"]

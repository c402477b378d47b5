"""Database helpers shared by every app."""

from django.db import connection

BULK_ANALYZE_THRESHOLD = 200


def analyze_after_bulk_load(*models, rows: int) -> None:
    """Refresh the planner's statistics after a bulk load.

    A table filled in one go still looks empty to PostgreSQL until autovacuum analyses it,
    and the planner then picks nested loops that take a minute over a few hundred rows
    (seen with the demo's fresh GPU price table). Run inside the loading transaction, ANALYZE
    counts the transaction's own new rows.
    """
    if rows < BULK_ANALYZE_THRESHOLD:
        return
    with connection.cursor() as cursor:
        for model in models:
            cursor.execute(f'ANALYZE "{model._meta.db_table}"')

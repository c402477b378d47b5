from datetime import UTC

import django_filters


class UtcIsoDateTimeFilter(django_filters.IsoDateTimeFilter):
    """An ISO 8601 date-time filter that compares in UTC.

    Python accepts UTC offsets up to ±23:59, PostgreSQL only up to ±15:59: a query with
    `?since=2026-01-01T00:00+23:06` would reach the database and fail. In UTC it cannot.
    """

    def filter(self, qs, value):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(UTC)
        return super().filter(qs, value)

from rest_framework import pagination


class CursorPagination(pagination.CursorPagination):
    """Stable pages over rows that keep changing: newest first by default."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

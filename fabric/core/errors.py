"""Errors raised by the pure fabric modules."""

from __future__ import annotations


class HostlistError(ValueError):
    """A hostlist expression such as ``node[01-04`` that cannot be expanded."""


class FabricFormatError(ValueError):
    """A fabric description that is rejected as a whole.

    ``str()`` is exactly ``PATH:LINE: what is wrong`` so that editors and CI logs can jump to
    the offending line.
    """

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"

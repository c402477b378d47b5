"""Bad input is reported as one line naming the file and line, never as a traceback."""

from __future__ import annotations


class InputError(Exception):
    """`path:line: message`, or `path: message` when no line applies."""

    def __init__(self, path: str, line: int | None, message: str) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line
        self.message = message

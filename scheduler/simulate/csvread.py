"""Reading the simulator's CSV files: required columns, typed cells, errors by file and line."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence

from scheduler.simulate.errors import InputError


class Row:
    """One data row; typed getters raise InputError naming the file, the line and the column."""

    def __init__(self, path: str, line: int, cells: dict[str, str]) -> None:
        self.path = path
        self.line = line
        self.cells = cells

    def error(self, message: str) -> InputError:
        return InputError(self.path, self.line, message)

    def text(self, column: str) -> str:
        return (self.cells.get(column) or "").strip()

    def number(self, column: str, default: float | None = None) -> float:
        value = self.text(column)
        if not value:
            if default is None:
                raise self.error(f"{column} is empty")
            return default
        try:
            number = float(value)
        except ValueError:
            raise self.error(f"{column} is not a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise self.error(f"{column} is not a number")
        return number

    def count(self, column: str, default: int | None = None, minimum: int = 0) -> int:
        """A whole, non-negative (or at least `minimum`) number; `2.0` is accepted as 2."""
        number = self.number(column, None if default is None else float(default))
        if number != int(number):
            raise self.error(f"{column} is not a whole number")
        if number < minimum:
            raise self.error(f"{column} must be at least {minimum}")
        return int(number)


def read_rows(path: str, required: Sequence[str]) -> Iterator[Row]:
    """Rows of a CSV file with a header naming at least `required`; line numbers are the file's."""
    try:
        handle = open(path, newline="", encoding="utf-8-sig")  # tolerate a byte-order mark
    except OSError as error:
        raise InputError(path, None, f"cannot read: {error.strerror}") from None
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = [name.strip() for name in reader.fieldnames or []]
            reader.fieldnames = header
            missing = [name for name in required if name not in header]
            if missing:
                raise InputError(path, 1, f"missing column {', '.join(missing)}")
            for cells in reader:
                if None in cells:
                    raise InputError(path, reader.line_num, "more cells than columns")
                yield Row(path, reader.line_num, cells)
        except UnicodeDecodeError:
            raise InputError(path, reader.line_num + 1, "not UTF-8 text") from None
        except csv.Error as error:
            raise InputError(path, reader.line_num, f"not CSV: {error}") from None

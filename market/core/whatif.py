"""What the JSON what-if commands share: one input error, its field readers, one skeleton.

`python -m scheduler.clearing` and `python -m scheduler.placement gang|mig` read one JSON
object on stdin and write one on stdout. Malformed input exits with status 2 and one line on
stderr, `error: FIELD: message`; an answer, even a refusal, exits 0. Unknown keys are
rejected, so a misspelt field is never ignored. The engines raise `InvalidInput` for input
they cannot use, so the commands report their errors and the parsers' in the same way.

This lives with the clearing core, the lower of the two engines, so both can import it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any, TextIO

Main = Callable[[list[str], TextIO, TextIO, TextIO], int]


class InvalidInput(ValueError):
    """Malformed input; `field` names it, e.g. `request.gpus` or `bids[2].hours`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def read_object(value: Any, field: str, allowed: set[str]) -> dict:
    """A JSON object with no key outside `allowed`; `field` "input" is the whole document."""
    if not isinstance(value, dict):
        raise InvalidInput(field, "must be an object")
    for key in value:
        if key not in allowed:
            raise InvalidInput(f"{field}.{key}" if field != "input" else key, "unknown field")
    return value


def read_text(value: Any, field: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    return value


def read_texts(value: Any, field: str) -> list[str]:
    if not isinstance(value, list):
        raise InvalidInput(field, "must be a list of strings")
    return [read_text(item, f"{field}[{i}]") for i, item in enumerate(value)]


def read_int(value: Any, field: str, minimum: int = 0, optional: bool = False,
             too_small: str | None = None) -> int | None:
    """A JSON integer (not a boolean) of at least `minimum`; None for a missing one when
    `optional`. `too_small` is the refusal below the minimum, by default "must not be negative"
    for a minimum of 0 and "must be at least N" otherwise."""
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(field, "must be an integer")
    if value < minimum:
        if too_small is None:
            too_small = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
        raise InvalidInput(field, too_small)
    return value


def read_list(value: Any, field: str) -> list:
    if not isinstance(value, list):
        raise InvalidInput(field, "must be a list")
    return value


def read_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(field, "must be true or false")
    return value


def answer_json(answer: Callable[[Any], dict], stdin: TextIO, stdout: TextIO,
                stderr: TextIO) -> int:
    """Read the document on stdin, write `answer(document)` on stdout; the exit status."""
    try:
        document = json.loads(stdin.read())
    except json.JSONDecodeError as error:
        print(f"error: input: not valid JSON ({error.msg} at line {error.lineno})", file=stderr)
        return 2
    try:
        result = answer(document)
    except InvalidInput as error:
        print(f"error: {error.field}: {error.message}", file=stderr)
        return 2
    json.dump(result, stdout)
    stdout.write("\n")
    return 0


def exit_with(main: Main) -> None:
    """Run a command's `main` on this process's arguments and streams, and exit with it."""
    sys.exit(main(sys.argv[1:], sys.stdin, sys.stdout, sys.stderr))

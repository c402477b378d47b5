"""The offers query language (`GET /api/v1/offers/?q=...`, the `ibex` CLI's `find`), parsed
over plain text: no Django. `market/offers.py` evaluates what this returns in the database.

A query is terms separated by spaces, all of which must hold:

    model=H100-80GB gpus>=64 price<=2.50 leaf_free>=16 provider in [acme,"big dc"]

Each term is `field op value`; spaces around the operator are allowed, and `in` needs them.
Operators: `=`, `!=`, `<`, `<=`, `>`, `>=`, `in`. Values: numbers (`64`, `2.49`), strings
bare (`H100-80GB`) or double-quoted (`"a b"`, `\\"` and `\\\\` escaped), `true`/`false`, and
for `in` a list `[a,b]`. Every error names its term (1-based) and the column (1-based, in the
whole query) of the part at fault: `term 2 at column 14: unknown field 'colour' (...)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

# field → (kind, operators it takes, applied per GPU before grouping or to the group after)
TEXT_OPS = ("=", "!=", "in")
NUMBER_OPS = ("=", "!=", "<", "<=", ">", ">=", "in")


@dataclass(frozen=True)
class FieldSpec:
    kind: str  # "text", "int", "decimal", "share"
    ops: tuple[str, ...]
    per_gpu: bool
    help: str


FIELDS: dict[str, FieldSpec] = {
    "model": FieldSpec("text", TEXT_OPS, True, "GPU model name"),
    "gpus": FieldSpec("int", NUMBER_OPS, False, "free GPUs in the group"),
    "price": FieldSpec("decimal", NUMBER_OPS, False,
                       "dollars per GPU-hour of the group's cheapest free GPU"),
    "leaf_free": FieldSpec("int", NUMBER_OPS, False, "most free GPUs in one leaf of the group"),
    "spine_free": FieldSpec("int", NUMBER_OPS, False, "most free GPUs in one spine of the group"),
    "reliability": FieldSpec("decimal", NUMBER_OPS, False,
                             "the providers' measured availability over 30 days, 0-1"),
    "fabric": FieldSpec("text", TEXT_OPS, True, "fabric name"),
    "provider": FieldSpec("text", TEXT_OPS, True, "provider slug"),
    "mig_profile": FieldSpec("text", TEXT_OPS, True, "a MIG profile the GPUs sell"),
    "share": FieldSpec("share", ("=", ">=", ">"), True,
                       "true/false: sells shares; a number: a share that large fits"),
}
FIELD_NAMES = tuple(FIELDS)
OPERATORS = ("<=", ">=", "!=", "=", "<", ">")  # longest first; `in` is a word

GROUP_KEYS = ("model", "fabric", "leaf", "provider")
# what a result can be sorted by: a group key, or one of these (`price`: the cheapest)
SORT_FIELDS = ("gpus", "price", "max_price", "leaf_free", "spine_free", "reliability")
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_QUERY_CHARS = 2000
MAX_SHARE = 999


class QueryError(ValueError):
    """A malformed query, or `group_by`, `sort` or `limit`; `param` names the parameter."""

    def __init__(self, message: str, *, param: str = "q", term: int | None = None,
                 column: int | None = None) -> None:
        self.param = param
        self.term = term
        self.column = column
        self.detail = message
        where = f"term {term} at column {column}: " if term is not None else ""
        super().__init__(where + message)
        self.message = where + message


@dataclass(frozen=True)
class Term:
    field: str
    op: str
    value: object  # str, int, Decimal, bool, or a tuple of them for `in`
    number: int  # 1-based
    column: int  # 1-based, where the term starts

    @property
    def per_gpu(self) -> bool:
        return FIELDS[self.field].per_gpu


@dataclass(frozen=True)
class OffersQuery:
    terms: tuple[Term, ...] = ()
    group_by: tuple[str, ...] = ("model",)
    sort: str = "price"
    descending: bool = False
    limit: int = DEFAULT_LIMIT

    def per_gpu(self) -> list[Term]:
        return [t for t in self.terms if t.per_gpu]

    def per_group(self) -> list[Term]:
        return [t for t in self.terms if not t.per_gpu]


# --- the grammar ----------------------------------------------------------------------------


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def done(self) -> bool:
        return self.at >= len(self.text)

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def skip_spaces(self) -> None:
        while self.peek().isspace():
            self.at += 1

    @property
    def column(self) -> int:
        return self.at + 1


def parse_query(text: str) -> tuple[Term, ...]:
    """The terms of a query (empty: no conditions), or QueryError naming the term at fault."""
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"a query is at most {MAX_QUERY_CHARS} characters")
    reader = _Reader(text)
    terms: list[Term] = []
    reader.skip_spaces()
    while not reader.done():
        terms.append(_term(reader, len(terms) + 1))
        if not reader.done() and not reader.peek().isspace():
            raise QueryError(f"expected a space before the next term, found "
                             f"{reader.peek()!r}", term=len(terms), column=reader.column)
        reader.skip_spaces()
    return tuple(terms)


def _term(reader: _Reader, number: int) -> Term:
    start = reader.column
    name_at = reader.at
    while reader.peek().isalnum() or reader.peek() == "_":
        reader.at += 1
    name = reader.text[name_at:reader.at]
    if not name:
        raise QueryError(f"expected a field name, found {reader.peek()!r} (fields: "
                         f"{', '.join(FIELD_NAMES)})", term=number, column=start)
    if name not in FIELDS:
        raise QueryError(f"unknown field {name!r} (fields: {', '.join(FIELD_NAMES)})",
                         term=number, column=start)
    spec = FIELDS[name]
    had_space = reader.peek().isspace()
    reader.skip_spaces()
    op_column = reader.column
    op = _operator(reader, had_space)
    if op is None:
        found = repr(reader.peek()) if reader.peek() else "the end of the query"
        raise QueryError(f"expected an operator after {name!r} (=, !=, <, <=, >, >=, in), "
                         f"found {found}", term=number, column=op_column)
    if op not in spec.ops:
        raise QueryError(f"{name} takes {', '.join(spec.ops)}, not {op!r}", term=number,
                         column=op_column)
    reader.skip_spaces()
    value_column = reader.column
    if reader.done():
        raise QueryError(f"{name}{op}: expected a value, found the end of the query",
                         term=number, column=value_column)
    if op == "in":
        if reader.peek() != "[":
            raise QueryError(f"{name} in: expected a list like [a,b]", term=number,
                             column=value_column)
        raw = _list(reader, number)
        value = tuple(_typed(name, spec, op, item, quoted, number, col)
                      for item, quoted, col in raw)
    else:
        if reader.peek() == "[":
            raise QueryError(f"a list goes with `in`, not {op!r}", term=number,
                             column=value_column)
        item, quoted = _scalar(reader, number, stops="")
        value = _typed(name, spec, op, item, quoted, number, value_column)
    return Term(field=name, op=op, value=value, number=number, column=start)


def _operator(reader: _Reader, had_space: bool) -> str | None:
    for op in OPERATORS:
        if reader.text.startswith(op, reader.at):
            reader.at += len(op)
            return op
    if had_space and reader.text.startswith("in", reader.at):
        after = reader.text[reader.at + 2:reader.at + 3]
        if after == "" or after.isspace() or after == "[":
            reader.at += 2
            return "in"
    return None


def _scalar(reader: _Reader, number: int, stops: str) -> tuple[str, bool]:
    """A bare or quoted value; bare ones end at a space or one of `stops`."""
    if reader.peek() == '"':
        start = reader.column
        reader.at += 1
        chars = []
        while True:
            if reader.done():
                raise QueryError("a quoted value is not closed (a \" is missing)", term=number,
                                 column=start)
            char = reader.peek()
            reader.at += 1
            if char == "\\" and reader.peek() in ('"', "\\"):
                chars.append(reader.peek())
                reader.at += 1
            elif char == '"':
                return "".join(chars), True
            else:
                chars.append(char)
    start = reader.at
    while not reader.done() and not reader.peek().isspace() and reader.peek() not in stops:
        if reader.peek() in '"[]':
            raise QueryError(f"unexpected {reader.peek()!r} in a value (quote values that "
                             f"hold it)", term=number, column=reader.column)
        reader.at += 1
    return reader.text[start:reader.at], False


def _list(reader: _Reader, number: int) -> list[tuple[str, bool, int]]:
    open_column = reader.column
    reader.at += 1  # [
    items: list[tuple[str, bool, int]] = []
    while True:
        reader.skip_spaces()
        if reader.done():
            raise QueryError("a list is not closed (a ] is missing)", term=number,
                             column=open_column)
        if reader.peek() == "]" and not items:
            raise QueryError("an empty list matches nothing: name at least one value",
                             term=number, column=reader.column)
        column = reader.column
        item, quoted = _scalar(reader, number, stops=",]")
        if not item and not quoted:
            raise QueryError("expected a value in the list", term=number, column=column)
        items.append((item, quoted, column))
        reader.skip_spaces()
        if reader.peek() == ",":
            reader.at += 1
            continue
        if reader.peek() == "]":
            reader.at += 1
            return items
        if reader.done():
            raise QueryError("a list is not closed (a ] is missing)", term=number,
                             column=open_column)
        raise QueryError(f"expected , or ] in the list, found {reader.peek()!r}", term=number,
                         column=reader.column)


def _typed(name: str, spec: FieldSpec, op: str, text: str, quoted: bool, number: int,
           column: int):
    def fail(message: str):
        return QueryError(message, term=number, column=column)

    if spec.kind == "text":
        if not text:
            raise fail(f"{name}: expected a non-empty value")
        return text
    if spec.kind == "share":
        if not quoted and text in ("true", "false"):
            if op != "=":
                raise fail(f"share{op} takes a size in thousandths (1-{MAX_SHARE}), "
                           f"not {text}")
            return text == "true"
        size = _integer(text, quoted)
        if size is None or not 1 <= size <= MAX_SHARE:
            raise fail(f"share: expected true, false or a size in thousandths "
                       f"(1-{MAX_SHARE}), found {text!r}")
        return size
    if quoted:
        raise fail(f"{name}: expected a number, found the string {text!r}")
    if spec.kind == "int":
        value = _integer(text, quoted)
        if value is None:
            raise fail(f"{name}: expected a whole number, found {text!r}")
        return value
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise fail(f"{name}: expected a number like 2.49, found {text!r}") from None
    if not value.is_finite() or "e" in text.lower() or text.startswith(("+", "-")):
        raise fail(f"{name}: expected a plain number like 2.49, found {text!r}")
    if name == "reliability" and value > 1:
        raise fail(f"reliability is a fraction from 0 to 1, found {text!r}")
    return value


def _integer(text: str, quoted: bool) -> int | None:
    if quoted or not text.isdigit() or not text.isascii():
        return None
    return int(text)


# --- the other parameters -------------------------------------------------------------------


def parse_group_by(text: str | None) -> tuple[str, ...]:
    """`model,fabric` → the group keys in GROUP_KEYS order; model is always one of them."""
    if text is None or not text.strip():
        return ("model",)
    names = [name.strip() for name in text.split(",")]
    for name in names:
        if name not in GROUP_KEYS:
            raise QueryError(f"unknown group key {name!r} (keys: {', '.join(GROUP_KEYS)})",
                             param="group_by")
    wanted = {"model", *names}
    return tuple(key for key in GROUP_KEYS if key in wanted)


def parse_sort(text: str | None, group_by: tuple[str, ...]) -> tuple[str, bool]:
    """`price`, `-price` or `price-` (descending) → (field, descending)."""
    if text is None or not text.strip():
        return "price", False
    text = text.strip()
    descending = text.startswith("-") or text.endswith("-")
    name = text.strip("-")
    allowed = (*SORT_FIELDS, *group_by)
    if name not in allowed:
        raise QueryError(f"cannot sort by {text!r} (fields: {', '.join(allowed)}; a - before "
                         f"or after for descending)", param="sort")
    if text.startswith("-") and text.endswith("-"):
        raise QueryError(f"put one - before or after the field, not both: {text!r}",
                         param="sort")
    return name, descending


def parse_limit(text: str | None) -> int:
    if text is None or not str(text).strip():
        return DEFAULT_LIMIT
    text = str(text).strip()
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise QueryError(f"limit is a whole number from 1 to {MAX_LIMIT}, found {text!r}",
                         param="limit")
    return int(text)


def parse_offers_query(*, q: str | None = None, group_by: str | None = None,
                       sort: str | None = None, limit: str | None = None) -> OffersQuery:
    """The four query parameters of `GET /offers/`, checked; QueryError names the one at
    fault (its `param`)."""
    keys = parse_group_by(group_by)
    field, descending = parse_sort(sort, keys)
    return OffersQuery(terms=parse_query(q or ""), group_by=keys, sort=field,
                       descending=descending, limit=parse_limit(limit))

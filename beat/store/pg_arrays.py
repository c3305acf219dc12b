"""Array parameters written as PostgreSQL array literals.

A claim sends its batch as a few arrays (``unnest(:ids, :fire_ats, ...)``), one
element per run. Bound as Python lists, each element is dumped by the driver in
Python, one call apiece: the dumping of a claim's arrays was 8% of what a leader
spent on a run (profiled in a burst of 100,000 daily crons). Written here as one
text literal each (``{a,b,...}``, joined in one call, a timestamp formatted once
per distinct value), they are parsed by PostgreSQL, in C.

Each literal is sent as a parameter *of its array type* (a dumper per element
type, below), not as text cast in the statement: PostgreSQL reads it once, as a
constant it plans with (an index scan, a hashed ``= ANY``). Text cast in the
statement is an expression instead, and on a table without statistics yet the
planner may scan it and parse the literal again for every row: one batch of
1,000 took 20 s where the typed parameter takes 25 ms.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, ClassVar

import psycopg
from psycopg.adapt import Dumper
from sqlalchemy import bindparam, column, func
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import TypeDecorator

#: An element that is SQL NULL.
_NULL = "NULL"


class ArrayLiteral(str):
    """An array literal; its subclass names the PostgreSQL type of its elements."""

    element_type: ClassVar[str]


class UuidArray(ArrayLiteral):
    element_type = "uuid"


class BigintArray(ArrayLiteral):
    element_type = "int8"


class IntegerArray(ArrayLiteral):
    element_type = "int4"


class TimestamptzArray(ArrayLiteral):
    element_type = "timestamptz"


class TextArray(ArrayLiteral):
    element_type = "text"


class _LiteralParameter(TypeDecorator[Any]):
    """An array column type whose bound value is an ``ArrayLiteral``, handed to the
    driver as it is (its dumper gives it its type)."""

    impl = ARRAY
    cache_ok = True

    def bind_processor(self, dialect: Any) -> None:
        return None


def array_param(name: str, item: Any) -> Any:
    """The bound parameter ``name``: an array of ``item``, given as an ``ArrayLiteral``."""
    return bindparam(name, type_=_LiteralParameter(item))


def parallel_arrays(name: str, **arrays: Any) -> Any:
    """``unnest(:a, :b, ...) AS name(a, b, ...)``: parallel arrays as a table, each
    one parameter whatever the batch's size (an ``ArrayLiteral``)."""
    return (
        func.unnest(*(array_param(key, item) for key, item in arrays.items()))
        .table_valued(*(column(key, item) for key, item in arrays.items()))
        .render_derived(name=name)
    )


def uuid_array(values: Iterable[uuid.UUID]) -> UuidArray:
    """``{hex,hex,...}``: PostgreSQL reads a UUID written without its dashes."""
    return UuidArray("{" + ",".join([value.hex for value in values]) + "}")


def bigint_array(values: Iterable[int]) -> BigintArray:
    return BigintArray(_numbers(values))


def integer_array(values: Iterable[int]) -> IntegerArray:
    return IntegerArray(_numbers(values))


def time_array(values: Iterable[datetime | None]) -> TimestamptzArray:
    """Aware datetimes (or None) in ISO 8601 with their offset; the runs of a burst
    share a few fire times, each formatted once."""
    written: dict[datetime | None, str] = {None: _NULL}
    elements = []
    for value in values:
        # Keyed in UTC: two times of one zone that differ only in ``fold`` (the hour
        # repeated when clocks go back) compare equal but are an hour apart.
        instant = None if value is None else _in_utc(value)
        element = written.get(instant)
        if element is None:
            assert instant is not None
            element = written[instant] = instant.isoformat()
        elements.append(element)
    return TimestamptzArray("{" + ",".join(elements) + "}")


def text_array(values: Iterable[str | None]) -> TextArray:
    """Each text double-quoted (a backslash before ``"`` and ``\\``), None as NULL."""
    return TextArray(
        "{" + ",".join([_NULL if value is None else _quoted(value) for value in values]) + "}"
    )


def _numbers(values: Iterable[int]) -> str:
    # int() first: a bool or a str given by mistake is written as the number or fails here.
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _in_utc(value: datetime) -> datetime:
    if value.utcoffset() is None:
        # Naive, it would be read in the session's time zone: a run at the wrong time.
        raise ValueError(f"{value!r} has no time zone")
    return value.astimezone(UTC)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _LiteralDumper(Dumper):
    #: The array type's OID, given to each instance only: were it the class's,
    #: registering the dumper would make it psycopg's dumper *for that OID* too (COPY
    #: looks dumpers up by OID), and lists would reach ``dump``.
    array_oid: ClassVar[int] = 0

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self.oid = self.array_oid

    def dump(self, obj: Any) -> bytes:
        return str.encode(obj)


def _register_dumpers() -> None:
    """Send each kind of literal in text format, typed as its array type."""
    for literal in (UuidArray, BigintArray, IntegerArray, TimestamptzArray, TextArray):
        info = psycopg.adapters.types[literal.element_type]
        dumper = type(f"{literal.__name__}Dumper", (_LiteralDumper,), {"array_oid": info.array_oid})
        psycopg.adapters.register_dumper(literal, dumper)


_register_dumpers()

"""The statements a worker sends for every run, compiled once.

A worker's transitions of a run (taken, started, ended) are statements built once, at
import, and bound per run (``beat.store.run_guard``). SQLAlchemy still does, at every
execution, what their text does not need done again: it computes the statement's
cache key (a walk of the whole expression), looks the compiled form up, and builds
the parameters from it. For an UPDATE of one row by its key that was a third of the
worker's CPU for the statement (350 µs through ``Connection.execute``, 235 µs through
``exec_driver_sql`` with the text and constants compiled once: one take of a plain run,
2,000 in a loop). ``execute`` here compiles a statement once per dialect and sends its
text with ``exec_driver_sql``: SQLAlchemy's connection, pool, events and error handling
stay in the path (``beat.store.db``: a lost connection is still a ``StoreUnavailable``,
a pooler's prepared-statement error still discards the connection), only its compiler
leaves it.

A statement compiled here must not expand a parameter at execution (``in_`` with a list
renders ``POSTCOMPILE``): ``one_of`` is the form that compiles to fixed text.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Connection, CursorResult, any_
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.base import Executable


@dataclass(frozen=True, slots=True)
class _Compiled:
    #: The statement's text in the driver's parameter style.
    text: str
    #: The values of the parameters the statement holds itself (its literals).
    constants: dict[str, Any]
    #: How the driver is handed a caller's parameter that needs converting (JSON).
    processors: tuple[tuple[str, Callable[[Any], Any]], ...]

    def parameters(self, bound: Mapping[str, Any]) -> dict[str, Any]:
        parameters = self.constants | dict(bound)
        for name, process in self.processors:
            parameters[name] = process(parameters[name])
        return parameters


_compiled: weakref.WeakKeyDictionary[Executable, dict[str, _Compiled]] = weakref.WeakKeyDictionary()


def execute(conn: Connection, statement: Executable, bound: Mapping[str, Any]) -> CursorResult[Any]:
    """``conn.execute(statement, bound)``, the statement compiled once for ``conn``'s
    dialect (see the module docstring)."""
    compiled = _compiled_for(statement, conn.dialect)
    return conn.exec_driver_sql(compiled.text, compiled.parameters(bound))


def one_of(column: ColumnElement[Any], values: Sequence[Any]) -> ColumnElement[bool]:
    """``column`` equals one of ``values``: ``in_`` in a form whose text is fixed."""
    return column == any_(array(list(values)))


def _compiled_for(statement: Executable, dialect: Dialect) -> _Compiled:
    by_dialect = _compiled.setdefault(statement, {})
    key = f"{dialect.name}+{dialect.driver}:{dialect.paramstyle}"
    compiled = by_dialect.get(key)
    if compiled is None:
        compiled = by_dialect[key] = _compile(statement, dialect)
    return compiled


def _compile(statement: Executable, dialect: Dialect) -> _Compiled:
    compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
    if "POSTCOMPILE" in compiled.string:
        raise ValueError(f"a statement compiled once cannot expand a parameter: {compiled}")
    given = {name for name, bind in compiled.binds.items() if bind.required}
    every = compiled.construct_params(dict.fromkeys(given))
    processors = {
        name: process
        for name, bind in compiled.binds.items()
        if (process := bind.type.dialect_impl(dialect).bind_processor(dialect)) is not None
    }
    constants = {
        name: processors[name](value) if name in processors else value
        for name, value in every.items()
        if name not in given
    }
    return _Compiled(
        text=compiled.string,
        constants=constants,
        processors=tuple((name, processors[name]) for name in sorted(given & processors.keys())),
    )

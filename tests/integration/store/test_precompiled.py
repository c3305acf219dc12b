"""Statements compiled once (``beat.store.precompiled``): the same rows and answers as
SQLAlchemy's own execution, JSON parameters converted, literals kept, and a statement
whose text would change per execution refused."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Integer, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import JSONB

from beat.store import precompiled
from beat.store.all_roles import Store
from beat.store.tables import runs
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

_INSERT = (
    runs.insert()
    .values(
        id=bindparam("p_id"),
        task="jobs.t",
        state="queued",
        args=bindparam("p_args", type_=JSONB),
        kwargs={"fixed": [1, 2]},
        options=bindparam("p_options", type_=JSONB),
    )
    .returning(runs.c.attempt)
)
_ATTEMPT = (
    update(runs)
    .where(runs.c.id == bindparam("p_id"), precompiled.one_of(runs.c.state, ["queued", "x"]))
    .values(attempt=runs.c.attempt + bindparam("p_by", type_=Integer), state="running")
)


def test_a_statement_compiled_once_writes_what_sqlalchemy_would(store: Store) -> None:
    run_id = uuid.uuid4()
    args, options = [1, "two", {"three": None}], {"queue": "q", "expires": 3.5}
    with store.engine.begin() as conn:
        inserted = precompiled.execute(
            conn, _INSERT, {"p_id": run_id, "p_args": args, "p_options": options}
        )
        assert inserted.scalar_one() == 0
        assert precompiled.execute(conn, _ATTEMPT, {"p_id": run_id, "p_by": 2}).rowcount == 1
        # Not queued any more: the list of states is part of the statement's text.
        assert precompiled.execute(conn, _ATTEMPT, {"p_id": run_id, "p_by": 2}).rowcount == 0
    [row] = run_rows(store)
    assert (row.args, row.kwargs, row.options) == (args, {"fixed": [1, 2]}, options)
    assert (row.attempt, row.state) == (2, "running")


def test_a_statement_is_compiled_once_per_dialect(store: Store) -> None:
    statement = select(func.now() - func.now())
    with store.engine.connect() as conn:
        precompiled.execute(conn, statement, {})
        first = precompiled._compiled[statement]
        precompiled.execute(conn, statement, {})
    assert precompiled._compiled[statement] is first
    assert len(first) == 1


def test_a_statement_whose_text_expands_per_execution_is_refused(store: Store) -> None:
    statement = select(runs.c.id).where(runs.c.state.in_(["queued", "running"]))
    with store.engine.connect() as conn, pytest.raises(ValueError, match="expand a parameter"):
        precompiled.execute(conn, statement, {})

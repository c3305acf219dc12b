"""The idempotency guard: whether a delivery may start a run, taken in one
conditional statement; the row count (or the row returned) says who won, so two
deliveries of one run can never both start it.

A run may be started when it is ``pending`` or ``queued`` (new), ``retrying``
by a delivery at least as new as the last retry, ``running`` under a lease
that has expired, or ``running`` by a delivery newer than the attempt that
holds it (Celery publishes a retry before the attempt that asked for it has
ended: a retry with a zero countdown may arrive first). Anything else is a
duplicate delivery: refused and counted.

A run with ``expires`` is expired when PostgreSQL's ``now()`` has reached its
expiry instant (``fire_at`` + ``expires``, as beat put it in the message);
every statement that would take or start a run checks that in the same
statement, and a delivery that would have taken or started it ends it
``expired`` instead. No worker's clock is consulted.

Here too the pieces the other transitions are made of (a lease's end, the values
of an outcome, a refusal counted), and the bound parameters of the statements a
worker sends for every run: those are built once, at import, and bound per run.
Building one (SQLAlchemy's expression objects and their cache key) cost a worker
more CPU than sending it: a plain run's receipt took 0.94 ms of CPU rebuilt, 0.26 ms
built once (1,000 receipts; docs/benchmarks/2026-12-05-worker-cost.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Integer,
    Text,
    and_,
    bindparam,
    func,
    or_,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.records import Session
from beat.store.db import StoreConnection
from beat.store.precompiled import execute, one_of
from beat.store.tables import TZ, runs


def param(name: str, type_: Any) -> Any:
    """The bound parameter ``p_<name>`` of a statement built once (the prefix keeps it
    apart from the columns an UPDATE sets, whose names SQLAlchemy reserves)."""
    return bindparam(f"p_{name}", type_=type_)


RUN_ID = param("run_id", UUID(as_uuid=True))
OWNER = param("owner", Text)
WORKER = param("worker", Text)
LEASE_SECONDS = param("lease_seconds", Double)
RETRIES = param("retries", Integer)
#: The run's expiry by the database's clock; NULL: it does not expire.
EXPIRES = param("expires", TZ)


@dataclass(frozen=True, kw_only=True, slots=True)
class Started:
    """The delivery holds the run's lease."""

    attempt: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """The delivery is a duplicate: the run is done, or another worker holds a live lease."""

    state: str
    lease_owner: str | None


#: The state reported for a refused delivery whose run has no row (see ``start``).
MISSING = "missing"


def lease_until(seconds: Any) -> Any:
    """``seconds`` (a number or a parameter) from now, by the database's clock."""
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def not_expired(expires: Any) -> ColumnElement[bool]:
    """Before ``expires`` by the database's clock; a NULL ``expires`` never expires."""
    return or_(expires.is_(None), func.now() < expires)


def _startable(retries: Any, expires: Any = None) -> ColumnElement[bool]:
    """May a delivery carrying ``retries`` (Celery's retry count) start the run, before
    its ``expires`` (by the database's clock, in the statement that starts it)?

    A running run whose lease expired may be taken by another delivery (its worker is
    gone), unless it is a plain run whose body started: that one runs at most once,
    and only the reaper ends it (``lost``). Celery's next retry of it may, as ever."""
    body_started_plain = and_(runs.c.plain.is_(True), runs.c.started_at.is_not(None))
    startable = or_(
        one_of(runs.c.state, [RunState.PENDING.value, RunState.QUEUED.value]),
        and_(runs.c.state == RunState.RETRYING.value, retries >= runs.c.retries),
        and_(
            runs.c.state == RunState.RUNNING.value,
            or_(
                and_(runs.c.lease_expires_at < func.now(), ~body_started_plain),
                retries > runs.c.retries,
            ),
        ),
    )
    if expires is None:
        return startable
    return and_(startable, not_expired(expires))


def expired_values(reason: Any) -> dict[str, Any]:
    return {
        "state": RunState.EXPIRED.value,
        "reason": reason,
        "finished_at": func.now(),
        "lease_owner": None,
        "lease_expires_at": None,
    }


def expiry_reason(expires: datetime) -> str:
    return f"expired at {expires.isoformat()} before a worker started it"


def expire_instead(
    conn: Connection, run_id: uuid.UUID, may_start: ColumnElement[bool], expires: datetime | None
) -> Refused | None:
    """The delivery that may start the run (``may_start``) found it past ``expires`` by
    the database's clock: end it ``expired``; None if it has not expired (or no such)."""
    if expires is None:
        return None
    ended = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, may_start, func.now() >= expires)
        .values(**expired_values(expiry_reason(expires)))
    ).rowcount
    return Refused(state=RunState.EXPIRED.value, lease_owner=None) if ended else None


def outcome(
    state: RunState,
    *,
    error: Any,
    retries: Any,
    retry_in: Any,
) -> dict[str, Any]:
    """The values of an outcome: literals, or the bound parameters of a statement built
    once (``outcome_parameters``; a parameter's ``retry_in`` is bound at 0 or more)."""
    values: dict[str, Any] = {
        "state": state.value,
        "error": error,
        "lease_owner": None,
        "lease_expires_at": None,
        "duration_seconds": func.extract("epoch", func.now() - runs.c.started_at),
    }
    if state is RunState.RETRYING:
        due_in = retry_in if isinstance(retry_in, ColumnElement) else max(0.0, retry_in or 0.0)
        values["retry_due_at"] = lease_until(due_in)
        # The retry is a message of its own: the copies lost-message recovery sent of
        # the one before it do not count against it (``LeaderStore.requeue_missing``).
        values["recovery_sends"] = 0
    else:
        values["finished_at"] = func.now()
    if retries is not None:
        values["retries"] = retries
    return values


def outcome_parameters(state: RunState, *, with_retries: bool) -> dict[str, Any]:
    """``outcome``'s values as the parameters ``p_error``, ``p_retries_after`` (if
    ``with_retries``) and ``p_retry_in`` (``retrying``), for a statement built once."""
    return outcome(
        state,
        error=param("error", Text),
        retries=param("retries_after", Integer) if with_retries else None,
        retry_in=param("retry_in", Double),
    )


def outcome_binding(
    state: RunState, *, error: str | None, retries: int | None, retry_in: float | None
) -> dict[str, Any]:
    """The values bound to ``outcome_parameters(state, with_retries=retries is not None)``."""
    bound: dict[str, Any] = {"p_error": error}
    if retries is not None:
        bound["p_retries_after"] = retries
    if state is RunState.RETRYING:
        bound["p_retry_in"] = max(0.0, retry_in or 0.0)
    return bound


def refuse(conn: Connection, run_id: uuid.UUID) -> Refused:
    """Count a refused delivery on its run; a run with no row is reported ``missing``."""
    row = conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(duplicate_deliveries=runs.c.duplicate_deliveries + 1)
        .returning(runs.c.state, runs.c.lease_owner)
    ).one_or_none()
    if row is None:
        return Refused(state=MISSING, lease_owner=None)
    return Refused(state=row.state, lease_owner=row.lease_owner)


def literal_int(value: int) -> Any:
    """A bound integer, comparable with a column in SQL."""
    return bindparam(None, value, type_=Integer, unique=True)


class RunGuard(StoreConnection):
    """The guard every start of a run goes through (see the module docstring)."""

    def _changed_one(self, statement: Any, bound: dict[str, Any] | None = None) -> bool:
        """Run one conditional statement on one run (its parameters ``bound``); True if
        it changed the run."""
        with self._each_statement_commits() as conn:
            return bool(conn.execute(statement, bound or {}).rowcount == 1)

    def start(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        task: str,
        args: list[Any],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        retries: int,
        max_attempts: int,
        may_create: bool = True,
        task_id: str | None = None,
        expires: datetime | None = None,
        session: Session | None = None,
    ) -> Started | Refused:
        """Take the run's lease if this delivery may run it (one statement), else record a refusal.

        ``session`` is the beacon this worker process keeps (``beat.lease.beacon``):
        once both its halves are proven gone, the leader reclaims the run at once.

        A run that does not exist yet (a task sent with ``delay()``) is created,
        with its payload, so the reaper can publish it again, unless
        ``may_create`` is false: a delivery of a run that beat claimed whose row is
        gone (pruned by retention) is refused, since it ran long ago.
        ``task_id`` is kept when the caller's task ID is not the run ID.
        """
        bound = lease_binding(run_id, owner, worker, lease_seconds, retries, expires)
        bound["p_beacon"] = None if session is None else session.beacon
        if not may_create:
            return self._take(_TAKE_TO_START, bound, run_id, retries, expires)
        bound |= {
            "p_task_id": task_id,
            "p_task": task,
            "p_args": args,
            "p_kwargs": kwargs,
            "p_options": options,
            "p_max_attempts": max_attempts,
        }
        with self._each_statement_commits() as conn:
            attempt = execute(conn, _START_OR_CREATE, bound).scalar_one_or_none()
            if attempt is not None:
                return Started(attempt=attempt)
            return refuse(conn, run_id)

    def _take(
        self,
        statement: Any,
        bound: dict[str, Any],
        run_id: uuid.UUID,
        retries: int,
        expires: datetime | None = None,
    ) -> Started | Refused:
        """Start the stored run with ``statement`` (``take_statement``) bound to ``bound``,
        if a delivery carrying ``retries`` may (one statement)."""
        with self._each_statement_commits() as conn:
            attempt = execute(conn, statement, bound).scalar_one_or_none()
            if attempt is not None:
                return Started(attempt=attempt)
            expired = expire_instead(conn, run_id, _startable(literal_int(retries)), expires)
            return expired or refuse(conn, run_id)


def lease_binding(
    run_id: uuid.UUID,
    owner: str,
    worker: str,
    lease_seconds: float,
    retries: int,
    expires: datetime | None,
) -> dict[str, Any]:
    """What a delivery that takes a run binds to ``take_statement`` (and the upsert):
    the run, the lease's owner, worker and length, its retry count and expiry."""
    return {
        "p_run_id": run_id,
        "p_owner": owner,
        "p_worker": worker,
        "p_lease_seconds": lease_seconds,
        "p_retries": retries,
        "p_expires": expires,
    }


def take_statement(values: dict[str, Any]) -> Any:
    """The statement that starts a stored run, setting ``values``, if a delivery carrying
    ``p_retries`` may before ``p_expires`` (``_startable``); it returns the attempt."""
    return (
        update(runs)
        .where(runs.c.id == RUN_ID, _startable(RETRIES, EXPIRES))
        .values(
            **values,
            attempt=runs.c.attempt + 1,
            retries=func.greatest(runs.c.retries, RETRIES),
            published_at=func.coalesce(runs.c.published_at, func.now()),
            first_published_at=func.coalesce(runs.c.first_published_at, func.now()),
            first_started_at=func.coalesce(runs.c.first_started_at, func.now()),
            finished_at=None,
            error=None,
        )
        .returning(runs.c.attempt)
    )


#: What a delivery that starts the run sets (the idempotent base).
_LEASE_TO_START = {
    "state": RunState.RUNNING.value,
    "lease_owner": OWNER,
    "lease_expires_at": lease_until(LEASE_SECONDS),
    "started_at": func.now(),
    "worker": WORKER,
    "session_pid": None,  # the beacon's session is in beat_beacons
    "beacon": param("beacon", Text),
}
_TAKE_TO_START = take_statement(_LEASE_TO_START)


def _start_or_create() -> Any:
    insert = pg_insert(runs).values(
        id=RUN_ID,
        task_id=param("task_id", Text),
        task=param("task", Text),
        args=param("args", JSONB),
        kwargs=param("kwargs", JSONB),
        options=param("options", JSONB),
        attempt=1,
        retries=RETRIES,
        max_attempts=param("max_attempts", Integer),
        published_at=func.now(),
        first_published_at=func.now(),
        first_started_at=func.now(),
        **_LEASE_TO_START,
    )
    return insert.on_conflict_do_update(
        index_elements=[runs.c.id],
        set_=_LEASE_TO_START
        | {
            "attempt": runs.c.attempt + 1,
            "retries": func.greatest(runs.c.retries, insert.excluded.retries),
            "published_at": func.coalesce(runs.c.published_at, func.now()),
            "first_published_at": func.coalesce(runs.c.first_published_at, func.now()),
            "first_started_at": func.coalesce(runs.c.first_started_at, func.now()),
            "finished_at": None,
            "error": None,
        },
        where=_startable(insert.excluded.retries, EXPIRES),
    ).returning(runs.c.attempt)


#: An ad hoc run (``delay()``) is created by its first delivery, with its payload.
_START_OR_CREATE = _start_or_create()

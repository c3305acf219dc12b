"""The operator's SQL: run history, manual triggers, pruning and health probes.

Everything ``celery -A app schedules`` needs beyond the schedule CRUD of
:class:`beat.store.Store`. Like the other stores, it returns domain objects
and raises domain errors, and time is the database's ``now()``.

A manual trigger is an outbox entry: a ``pending`` run with no epoch. The
leader publishes pending runs of any other epoch at its next tick (see
``Store.pending_runs``), and the ``NOTIFY`` sent in the same transaction wakes
it at once. The schedule's ``next_fire_at`` is not touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, func, insert, literal, select, true
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.db import StoreConnection, create_store_engine
from beat.leader_store import PruneReport, new_run_values, run_copy_columns
from beat.schedule_store import schedule_not_found
from beat.tables import FINISHED_STATES, SCHEDULES_CHANNEL, RunState, runs, schedules

#: ``reason`` of a run made by :meth:`OpsStore.trigger`, to tell it from scheduled ones.
TRIGGER_REASON = "triggered manually"
BACKFILL_REASON = "backfill"

#: A point in time, or a distance back from the database's ``now()``.
Since = datetime | timedelta


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """One row of the run history, as shown to an operator."""

    id: uuid.UUID
    schedule_name: str | None
    task: str
    state: RunState
    fire_at: datetime | None
    claimed_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    attempt: int
    max_attempts: int
    retries: int
    duplicate_deliveries: int
    duration_seconds: float | None
    epoch: int | None
    reason: str | None
    error: str | None
    args: list[Any]
    kwargs: dict[str, Any]

    @property
    def lateness(self) -> timedelta | None:
        """How long after its fire time the run was handed to the broker."""
        if self.published_at is None or self.fire_at is None:
            return None
        return self.published_at - self.fire_at


@dataclass(frozen=True, kw_only=True, slots=True)
class LastRun:
    """The newest run of a schedule (by fire time)."""

    id: uuid.UUID
    state: RunState
    fire_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class QuarantinedSchedule:
    """A schedule the scheduler disabled because it could not be planned or published."""

    name: str
    reason: str | None
    quarantined_at: datetime


class OpsStore(StoreConnection):
    """Queries and maintenance for operators (see the module docstring)."""

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 2) -> OpsStore:
        """A store on ``url``; no connection is made until first use."""
        return cls(create_store_engine(url, pool_size=pool_size))

    # -- health -------------------------------------------------------------------

    def ping(self) -> datetime:
        """The database's time: proof that PostgreSQL answers."""
        with self._transaction() as conn:
            now: datetime = conn.execute(select(func.now())).scalar_one()
        return now

    def quarantined(self) -> list[QuarantinedSchedule]:
        """The quarantined schedules, oldest quarantine first."""
        query = (
            select(schedules.c.name, schedules.c.disabled_reason, schedules.c.quarantined_at)
            .where(schedules.c.quarantined_at.is_not(None))
            .order_by(schedules.c.quarantined_at, schedules.c.name)
        )
        with self._transaction() as conn:
            return [
                QuarantinedSchedule(
                    name=row.name, reason=row.disabled_reason, quarantined_at=row.quarantined_at
                )
                for row in conn.execute(query)
            ]

    # -- run history --------------------------------------------------------------

    def runs(
        self,
        *,
        schedule_name: str | None = None,
        state: RunState | None = None,
        since: Since | None = None,
        limit: int = 20,
    ) -> list[RunRecord]:
        """Runs newest first (by fire time, or claim time for runs without one)."""
        when = _run_time()
        query = select(runs).order_by(when.desc(), runs.c.id).limit(limit)
        if schedule_name is not None:
            query = query.where(runs.c.schedule_name == schedule_name)
        if state is not None:
            query = query.where(runs.c.state == state.value)
        if since is not None:
            query = query.where(when >= _moment(since))
        with self._transaction() as conn:
            return [_record_from_row(row) for row in conn.execute(query)]

    def run(self, run_id: uuid.UUID) -> RunRecord | None:
        with self._transaction() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
        return None if row is None else _record_from_row(row)

    def last_runs(self) -> dict[str, LastRun]:
        """The newest run of every schedule that has one, by schedule name.

        One index probe per schedule (``LATERAL ... LIMIT 1`` on the history index).
        """
        newest = (
            select(runs.c.id, runs.c.state, runs.c.fire_at)
            .where(runs.c.schedule_name == schedules.c.name)
            .order_by(runs.c.fire_at.desc())
            .limit(1)
            .lateral("newest")
        )
        query = select(schedules.c.name, newest.c.id, newest.c.state, newest.c.fire_at).join(
            newest, true()
        )
        with self._transaction() as conn:
            return {
                row.name: LastRun(id=row.id, state=RunState(row.state), fire_at=row.fire_at)
                for row in conn.execute(query)
            }

    # -- operations ---------------------------------------------------------------

    def trigger(self, name: str) -> RunRecord:
        """Queue one run of schedule ``name`` now, outside its timing (even if paused).

        One ``INSERT ... SELECT`` plus a ``NOTIFY`` that wakes the leader, in one
        transaction; the leader publishes the run at its next tick.
        """
        run_id = uuid.uuid4()
        values = run_copy_columns(
            id=literal(run_id, runs.c.id.type),
            fire_at=func.now(),
            state=literal(RunState.PENDING.value),
            reason=literal(TRIGGER_REASON),
        )
        source = select(*values.values()).where(schedules.c.name == name)
        statement = insert(runs).from_select(list(values), source).returning(*runs.c)
        with self._transaction() as conn:
            row = conn.execute(statement).one_or_none()
            if row is None:
                raise schedule_not_found(name)
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "trigger")))
        return _record_from_row(row)

    def backfill(
        self, name: str, fire_times: Callable[[datetime], list[datetime]]
    ) -> list[RunRecord]:
        """Queue one run of schedule ``name`` per fire time, skipping fire times that
        already have a run (unique per schedule and fire time), and wake the leader.

        ``fire_times(now)`` gives them at the database's ``now()`` of the writing
        transaction; what it raises refuses the backfill, nothing written."""
        with self._transaction() as conn:
            now = conn.execute(select(func.now())).scalar_one()
            schedule = conn.execute(select(schedules).where(schedules.c.name == name)).one_or_none()
            if schedule is None:
                raise schedule_not_found(name)
            rows = [
                new_run_values(
                    schedule,
                    fire_at=fire_at,
                    state=RunState.PENDING,
                    reason=BACKFILL_REASON,
                    max_attempts=schedule.max_attempts,
                )
                for fire_at in fire_times(now)
            ]
            inserted = (
                list(
                    conn.execute(
                        pg_insert(runs)
                        .on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at")
                        .returning(*runs.c),
                        rows,
                    )
                )
                if rows
                else []
            )
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "backfill")))
        return sorted((_record_from_row(row) for row in inserted), key=lambda r: r.fire_at or 0)


def _run_time() -> ColumnElement[datetime]:
    """When a run belongs in history: its fire time, else (a run sent with ``delay()``)
    when it was recorded."""
    return func.coalesce(runs.c.fire_at, runs.c.claimed_at)


def _moment(since: Since) -> Any:
    if isinstance(since, timedelta):
        return func.now() - since
    return since


def _record_from_row(row: Row[Any]) -> RunRecord:
    return RunRecord(
        id=row.id,
        schedule_name=row.schedule_name,
        task=row.task,
        state=RunState(row.state),
        fire_at=row.fire_at,
        claimed_at=row.claimed_at,
        published_at=row.published_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker=row.worker,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        retries=row.retries,
        duplicate_deliveries=row.duplicate_deliveries,
        duration_seconds=row.duration_seconds,
        epoch=row.epoch,
        reason=row.reason,
        error=row.error,
        args=list(row.args),
        kwargs=dict(row.kwargs),
    )


__all__ = [
    "FINISHED_STATES",
    "LastRun",
    "OpsStore",
    "PruneReport",
    "QuarantinedSchedule",
    "RunRecord",
]

"""The runs an operator asks of a schedule: a manual trigger, a backfill.

A manual trigger or a backfill is an outbox entry: ``pending`` runs with no
epoch. The leader publishes pending runs of any other epoch at its next tick
(see ``LeaderStore.pending_runs``), and the ``NOTIFY`` sent in the same
transaction wakes it at once. The schedule's ``next_fire_at`` is not touched."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import (
    Connection,
    func,
    literal,
    select,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.errors import InvalidSchedule
from beat.models import ChangeAction, RunState
from beat.records import ChangeContext, RunRecord
from beat.store.db import StoreConnection
from beat.store.rows import (
    new_run_values,
    record_from_row,
    run_copy_columns,
)
from beat.store.schedule_changes import record_runs_made
from beat.store.stored_schedules import (
    readable,
    schedule_not_found,
    stored_columns,
    stored_schedule,
)
from beat.store.tables import SCHEDULES_CHANNEL, runs, schedules

#: ``reason`` of a run made by :meth:`ScheduleStore.trigger`, to tell it from scheduled ones.
TRIGGER_REASON = "triggered manually"
BACKFILL_REASON = "backfill"


class OperatorRuns(StoreConnection):
    """Runs queued by an operator (see the module docstring)."""

    def trigger(
        self, name: str, *, run_id: uuid.UUID | None = None, change: ChangeContext | None = None
    ) -> RunRecord:
        """Queue one run of schedule ``name`` now, outside its timing (even if paused).

        One ``INSERT ... SELECT`` plus a ``NOTIFY`` that wakes the leader, in one
        transaction; the leader publishes the run at its next tick.

        ``run_id`` makes the trigger idempotent: a second trigger with the same ID
        (a form posted twice, a retried request) returns the run the first queued
        rather than queuing another. InvalidSchedule if that ID is another
        schedule's run.
        """

        chosen = run_id or uuid.uuid4()
        values = run_copy_columns(
            id=literal(chosen, runs.c.id.type),
            fire_at=func.now(),
            state=literal(RunState.PENDING.value),
            reason=literal(TRIGGER_REASON),
            by_operator=literal(True),
        )
        source = select(*values.values()).where(schedules.c.name == name)
        statement = (
            pg_insert(runs)
            .from_select(list(values), source)
            .on_conflict_do_nothing(index_elements=[runs.c.id])
            .returning(*runs.c)
        )
        with self._transaction() as conn:
            _check_runnable(conn, name)
            row = conn.execute(statement).one_or_none()
            if row is None:
                return self._triggered_before(conn, name, chosen)
            record_runs_made(conn, name, ChangeAction.TRIGGER, change, f"run {chosen}")
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "trigger")))
        return record_from_row(row)

    def _triggered_before(self, conn: Connection, name: str, run_id: uuid.UUID) -> RunRecord:
        """The run an earlier trigger with ``run_id`` queued (nothing was inserted)."""
        earlier = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
        if earlier is None:
            raise schedule_not_found(name)
        if earlier.schedule_name != name:
            raise InvalidSchedule(
                f"run ID {run_id} is a run of another schedule: trigger without a run ID,"
                " or with a new one"
            )
        return record_from_row(earlier)

    def backfill(
        self,
        name: str,
        fire_times: Callable[[datetime], list[datetime]],
        *,
        change: ChangeContext | None = None,
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
                    by_operator=True,
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
            if inserted:
                times = sorted(row.fire_at for row in inserted)
                note = (
                    f"{len(inserted)} runs from {times[0].isoformat()} to {times[-1].isoformat()}"
                )
                record_runs_made(conn, name, ChangeAction.BACKFILL, change, note)
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "backfill")))
        return sorted((record_from_row(row) for row in inserted), key=lambda r: r.fire_at or 0)


def _check_runnable(conn: Connection, name: str) -> None:
    """InvalidSchedule if schedule ``name`` exists and its row cannot be read: a run
    of it would carry what the API refuses (10 MB of args) to the broker."""
    row = conn.execute(select(*stored_columns()).where(schedules.c.name == name)).one_or_none()
    if row is not None:
        readable(stored_schedule(row))

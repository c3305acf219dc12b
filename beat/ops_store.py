"""The operator's SQL: manual triggers, backfills and health probes (the run
history is :class:`beat.run_store.RunStore`'s).

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
from datetime import datetime

from sqlalchemy import func, insert, literal, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.db import StoreConnection, create_store_engine
from beat.leader_store import PruneReport, new_run_values, run_copy_columns
from beat.run_store import LastRun, RunRecord, record_from_row
from beat.schedule_store import schedule_not_found
from beat.tables import FINISHED_STATES, SCHEDULES_CHANNEL, RunState, runs, schedules

#: ``reason`` of a run made by :meth:`OpsStore.trigger`, to tell it from scheduled ones.
TRIGGER_REASON = "triggered manually"
BACKFILL_REASON = "backfill"


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
        return record_from_row(row)

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
        return sorted((record_from_row(row) for row in inserted), key=lambda r: r.fire_at or 0)


__all__ = [
    "FINISHED_STATES",
    "LastRun",
    "OpsStore",
    "PruneReport",
    "QuarantinedSchedule",
    "RunRecord",
]

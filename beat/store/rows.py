"""The row mapping the stores share: the columns of a new run, a run's lateness,
how a schedule's trigger and stored times read back from its row (a time
PostgreSQL holds as ``infinity`` fails its own row only), and how a value nobody
can read is shown.
No store imports another store's helpers: they come from here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Double,
    Row,
    Text,
    case,
    cast,
    func,
)

from beat.claim.run_ids import new_run_id
from beat.errors import (
    InvalidSchedule,
)
from beat.models import (
    RunState,
    TriggerKind,
)
from beat.records import RunRecord
from beat.schedule.timing import Cron, Every, Once, Trigger
from beat.store.tables import (
    runs,
    schedules,
)


def run_copy_columns(**columns: Any) -> dict[str, Any]:
    """Columns of ``INSERT INTO beat_runs (...) SELECT ...`` for a run whose payload is
    copied from its schedule row (``beat_schedules`` in the FROM), plus ``columns``."""
    return {
        "schedule_id": schedules.c.id,
        "schedule_name": schedules.c.name,
        "task": schedules.c.task,
        "args": schedules.c.args,
        "kwargs": schedules.c.kwargs,
        "options": schedules.c.options,
        "max_attempts": schedules.c.max_attempts,
        **columns,
    }


def new_run_values(
    schedule: Any, *, fire_at: datetime | None, state: RunState, **columns: Any
) -> dict[str, Any]:
    """Columns of a new run of ``schedule`` (a stored or a due schedule), with a
    snapshot of its payload, so the run can be published again whatever becomes
    of the schedule."""
    return {
        "id": new_run_id(),
        "schedule_id": schedule.id,
        "schedule_name": schedule.name,
        "task": schedule.task,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
        "options": schedule.options,
        "fire_at": fire_at,
        "state": state.value,
        **columns,
    }


def lateness_seconds() -> ColumnElement[float]:
    """How late a run was handed to the broker, in seconds (``published_at - fire_at``);
    NULL for a run not published or without a fire time. ``date_part`` gives a float
    at once (``extract`` gives a numeric, a third slower over a million runs)."""
    return func.date_part("epoch", runs.c.published_at - runs.c.fire_at, type_=Double)


def finished_age() -> ColumnElement[datetime]:
    """When a finished run finished (``claimed_at`` for one that never had a
    ``finished_at``): the key of the retention index, of the run statistics' summary
    and of each schedule's newest outcome."""
    return func.coalesce(runs.c.finished_at, runs.c.claimed_at)


def trigger_from_row(row: Row[Any]) -> Trigger:
    kind = TriggerKind(row.trigger_kind)
    if kind is TriggerKind.CRON:
        return Cron(expression=row.cron, both_days=row.cron_both_days)
    if kind is TriggerKind.EVERY:
        return Every(seconds=row.every_seconds, anchor=row.anchor_at)
    return Once(at=row.run_at)


#: What an :class:`UnreadableSchedule` keeps of each stored value it shows.
PREVIEW_CHARS = 500


def finite(column: Any) -> ColumnElement[Any]:
    """SQL: a time column, NULL where it holds ``infinity`` or ``-infinity`` (which no
    datetime holds: psycopg refuses the whole result that carries one)."""
    return case((func.isfinite(column), column)).label(column.name)


def infinite_times(*columns: Any) -> ColumnElement[str | None]:
    """SQL: which of the time ``columns`` hold an infinity, e.g. ``end_at = infinity``;
    NULL when none does."""
    named = [
        case((~func.isfinite(column), func.concat(f"{column.name} = ", cast(column, Text))))
        for column in columns
    ]
    return func.nullif(func.concat_ws(", ", *named), "").label("infinite_times")


#: The time columns of a schedule.
SCHEDULE_TIMES = [column for column in schedules.c if isinstance(column.type, DateTime)]


def stored_times_problem(infinite: str | None) -> None:
    """InvalidSchedule if a row's times hold an infinity (``infinite_times``)."""
    if infinite is not None:
        raise InvalidSchedule(
            f"{infinite} cannot be read (no date is infinite): write a time, or NULL"
        )


def preview(text_: str) -> str:
    """At most ``PREVIEW_CHARS`` of ``text_``, saying how long it is when cut."""
    if len(text_) <= PREVIEW_CHARS:
        return text_
    return f"{text_[:PREVIEW_CHARS]}… ({len(text_):,} characters in all)"


def record_from_row(row: Row[Any]) -> RunRecord:
    """A run of the history from its ``beat_runs`` row."""
    return RunRecord(
        id=row.id,
        task_id=row.task_id or str(row.id),
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
        workflow_run_id=row.workflow_run_id,
        step=row.step,
    )


def due_again() -> ColumnElement[datetime]:
    """When a run put back in the outbox may be sent again: not before its ``not_before``,
    nor, if it was a retry, before the retry is due (``retry_due_at``, by the database's
    clock, kept from the attempt that asked for it)."""
    return func.greatest(runs.c.not_before, runs.c.retry_due_at)

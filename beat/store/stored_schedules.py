"""A schedule as read from its row of the schedules table: a :class:`Schedule`,
or, when the row holds what the API refuses (written around it, with psql), an
:class:`UnreadableSchedule` saying why, never hiding the others."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    Text,
    cast,
)

from beat.errors import (
    InvalidSchedule,
    ScheduleNotFound,
)
from beat.models import (
    MisfirePolicy,
    Origin,
    OverlapPolicy,
    Schedule,
    ScheduleDefinition,
    TriggerKind,
)
from beat.schedule.define import (
    check_channel_names,
    check_failure_states,
    check_failure_threshold,
)
from beat.schedule.options import check_publish_options
from beat.schedule.payload import decoded_json, stored_payload
from beat.schedule.timing import parse_zone
from beat.store.rows import (
    SCHEDULE_TIMES,
    finite,
    infinite_times,
    preview,
    stored_times_problem,
    trigger_from_row,
)
from beat.store.tables import schedules


@dataclass(frozen=True, kw_only=True, slots=True)
class UnreadableSchedule:
    """A stored schedule whose row cannot be read as a schedule: written around the
    API (with psql), it holds what the API refuses (a time of ``infinity``, a cron that
    never fires, an infinite interval, an unknown zone, args over the limits). It is
    listed with its problem in place of its fire times, never hiding the others; the
    claim quarantines it. Its values are as stored, as text, cut to ``PREVIEW_CHARS``."""

    id: int
    name: str
    task: str
    #: Why it cannot be read, and what to do.
    problem: str
    #: Its timing as stored, e.g. ``cron 0 0 30 2 *``.
    timing: str
    timezone: str
    enabled: bool
    origin: Origin
    args: str
    kwargs: str
    options: str
    #: None where the stored time cannot be read (``problem`` names it).
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    runs_count: int
    disabled_reason: str | None
    quarantined_at: datetime | None


#: A row of the schedules table, as read.
StoredSchedule = Schedule | UnreadableSchedule


#: The payload columns, read as PostgreSQL's text of them: a value Python's ``json``
#: cannot read (nested too deep) fails its row, not the whole result.
_AS_TEXT = ("args", "kwargs", "options")


def stored_columns() -> list[ColumnElement[Any]]:
    """The columns of a schedule as :func:`stored_schedule` reads them: times that
    psycopg can load (see :func:`finite`), the payload as text, and which times are
    infinite."""
    read: list[ColumnElement[Any]] = []
    for column in schedules.c:
        if column in SCHEDULE_TIMES:
            read.append(finite(column))
        elif column.name in _AS_TEXT:
            read.append(cast(column, Text).label(column.name))
        else:
            read.append(column)
    return [*read, infinite_times(*SCHEDULE_TIMES)]


def stored_schedule(row: Row[Any]) -> StoredSchedule:
    """A row of :func:`stored_columns` as a schedule, or, when it holds what the API
    refuses, as an :class:`UnreadableSchedule` with its problem."""
    try:
        return schedule_from_row(row)
    except InvalidSchedule as exc:
        return unreadable_schedule(row, preview(str(exc)))  # it may quote 10 MB


def readable(stored: StoredSchedule) -> Schedule:
    """``stored`` if it could be read; InvalidSchedule saying what to do otherwise."""
    if isinstance(stored, UnreadableSchedule):
        raise InvalidSchedule(
            f"schedule {stored.name!r:.200} cannot be read: {stored.problem}; fix its row,"
            f" or remove it (`celery -A app schedules remove {stored.name:.200}`)"
        )
    return stored


def unreadable_schedule(row: Row[Any], problem: str) -> UnreadableSchedule:
    return UnreadableSchedule(
        id=row.id,
        name=row.name,
        task=row.task,
        problem=problem,
        timing=_stored_timing(row),
        timezone=row.timezone,
        enabled=row.enabled,
        origin=Origin(row.origin),
        args=preview(row.args),
        kwargs=preview(row.kwargs),
        options=preview(row.options),
        next_fire_at=row.next_fire_at,
        last_fire_at=row.last_fire_at,
        runs_count=row.runs_count,
        disabled_reason=row.disabled_reason,
        quarantined_at=row.quarantined_at,
    )


def _stored_timing(row: Row[Any]) -> str:
    """A row's timing as stored, for people to read."""
    if row.trigger_kind == TriggerKind.CRON.value:
        return preview(f"cron {row.cron}")
    if row.trigger_kind == TriggerKind.EVERY.value:
        return f"every {row.every_seconds:g}s"
    return f"at {'-' if row.run_at is None else row.run_at.isoformat()}"


def schedule_from_row(row: Row[Any]) -> Schedule:
    """A row of :func:`stored_columns` as a schedule; InvalidSchedule naming what the
    API would refuse in it."""
    stored_times_problem(row.infinite_times)
    parse_zone(row.timezone)
    args, kwargs = stored_payload(row.args, row.kwargs)
    definition = ScheduleDefinition(
        name=row.name,
        task=row.task,
        trigger=trigger_from_row(row),
        timezone=row.timezone,
        args=tuple(args),
        kwargs=kwargs,
        options=check_publish_options(decoded_json(row.options, "options")),
        enabled=row.enabled,
        misfire_policy=MisfirePolicy(row.misfire_policy),
        max_attempts=row.max_attempts,
        origin=Origin(row.origin),
        overlap_policy=OverlapPolicy(row.overlap_policy),
        jitter_seconds=row.jitter_seconds,
        start_at=row.start_at,
        end_at=row.end_at,
        max_runs=row.max_runs,
        alert_after_failures=row.alert_after_failures,
        pause_after_failures=row.pause_after_failures,
        failure_states=check_failure_states(row.failure_states),
        max_runtime_seconds=row.max_runtime_seconds,
        revoke_after_max_runtime=row.revoke_after_max_runtime,
        late_after_seconds=row.late_after_seconds,
        missed_after_seconds=row.missed_after_seconds,
        channels=check_channel_names(row.channels),
    )
    check_failure_threshold(row.alert_after_failures, "alert_after_failures")
    check_failure_threshold(row.pause_after_failures, "pause_after_failures")
    return Schedule(
        id=row.id,
        definition=definition,
        next_fire_at=row.next_fire_at,
        last_fire_at=row.last_fire_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        runs_count=row.runs_count,
        disabled_reason=row.disabled_reason,
        quarantined_at=row.quarantined_at,
        source=row.source,
        source_id=row.source_id,
        description=row.description,
        version=row.version,
    )


def schedule_not_found(name: str) -> ScheduleNotFound:
    """The error for a schedule name that is not stored, with where to look."""
    return ScheduleNotFound(
        f"no schedule named {name!r:.200}: `celery -A app schedules list` shows them"
    )

"""A source's schedule as a definition with its history: the fields a reader found,
checked by :func:`~beat.schedule.define.define` as any schedule is, continued from
its last run (``continuing``), or refused with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from beat.errors import ConfigError, InvalidSchedule
from beat.models import Origin, ScheduleDefinition
from beat.schedule.code import timing_of
from beat.schedule.define import define
from beat.schedule.timing import Cron
from beat.sources.continuing import continued
from beat.sources.records import Found, ReadContext, Refusal, SourceSchedule


class Refused(Exception):
    """A row that cannot be carried over; its message is the reason, one line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Row:
    """What a reader found for one schedule, in this scheduler's terms."""

    source: str
    source_id: str
    name: str
    task: str
    #: ``{"cron": Cron}``, ``{"every": seconds}`` or ``{"at": datetime}``.
    timing: Mapping[str, Any]
    #: The zone of a cron (None for an interval or a one-off: they have none).
    tz: str | None = None
    args: Any = None
    kwargs: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    #: When the source last ran it, or what it counts from instead (None: due now).
    last_run: datetime | None = None
    #: The last run the source recorded (None: none), for the history kept here.
    last_fire_at: datetime | None = None
    runs_count: int = 0
    #: A one-off the source has run: it never fires again.
    finished: bool = False
    #: The source fires nothing before this, and an overdue schedule at it.
    not_before: datetime | None = None
    origin: Origin = Origin.API
    description: str | None = None


def celery_timing(schedule: Any, relative: bool = False) -> dict[str, Cron | float | Any]:
    """The timing fields of one of Celery's schedule objects (crontab, schedule), as a
    ``beat_schedule`` entry's are read; Refused for those that cannot be followed."""
    try:
        return timing_of(schedule, relative, "its schedule")
    except ConfigError as exc:
        raise Refused(str(exc)) from None


def schedule_of(row: Row, context: ReadContext) -> Found:
    """The schedule ``row`` describes, or why it cannot be carried over."""
    try:
        code = context.code.get(row.name)
        return _as_defined(row, context) if code is None else _kept_in_code(row, *code, context)
    except (Refused, InvalidSchedule) as exc:
        return Refusal(source_name=row.name, source_id=row.source_id, reason=str(exc))


def _kept_in_code(
    row: Row, definition: ScheduleDefinition, code_hash: str, context: ReadContext
) -> SourceSchedule:
    """The row of an entry of the app's ``beat_schedule`` (celery beat keeps its last
    runs; django-celery-beat and RedBeat copy the entries into their store): it stays
    a schedule in code, under its name, as the code defines it, with the row's
    history and its pause, so that beat's sync of the code finds it unchanged."""
    check_task_known(context.app, definition.task)
    paused_or_not = replace(definition, enabled=row.enabled)
    return _continued(row, paused_or_not, context, definition.start_at, code_hash)


def _as_defined(row: Row, context: ReadContext) -> SourceSchedule:
    """The row's fields checked as any schedule's are (``define``)."""
    check_task_known(context.app, row.task)
    fields: dict[str, Any] = {
        **context.defaults,
        **row.timing,
        "tz": row.tz,
        "args": row.args,
        "kwargs": row.kwargs,
        "options": row.options,
        "enabled": row.enabled,
        "start_at": row.start_at,
        "end_at": row.end_at,
        "max_runs": row.max_runs,
        "origin": row.origin,
        "default_tz": context.default_tz,
        "allow_past": True,  # a one-off's time is the source's, past or not
        "now": context.now,
    }
    definition = define(context.prefix + row.name, row.task, **fields)
    return _continued(row, definition, context, row.not_before)


def _continued(
    row: Row,
    definition: ScheduleDefinition,
    context: ReadContext,
    not_before: datetime | None,
    code_hash: str | None = None,
) -> SourceSchedule:
    """``definition`` going on from the row's last run, with the row's history."""
    definition, next_fire_at = continued(
        definition, last_run=row.last_run, now=context.now, not_before=not_before
    )
    return SourceSchedule(
        definition=definition,
        next_fire_at=None if row.finished else next_fire_at,
        last_fire_at=row.last_fire_at,
        runs_count=row.runs_count,
        source=row.source,
        source_id=row.source_id,
        source_name=row.name,
        code_hash=code_hash,
        description=row.description,
    )


def check_task_known(app: Any, task: str) -> None:
    if app is not None and task not in app.tasks:
        raise Refused(
            f"task {task!r:.200} is not registered with the Celery app '{app.main}': import"
            " its module (the app's imports, or HABEAT_IMPORTS), or leave the schedule out"
            " (--only, --skip-invalid)"
        )

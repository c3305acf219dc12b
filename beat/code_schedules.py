"""Schedules defined in code: Celery's own ``beat_schedule`` setting and the
:func:`periodic` decorator on a task. Beat syncs them into PostgreSQL when it
starts (``Store.sync_code_schedules``).

``beat_schedule`` entries take the usual Celery forms (``crontab(...)``,
a number of seconds, a ``timedelta``, ``celery.schedules.schedule``) and also a
cron string. Solar schedules are refused: they have no cron equivalent. An
entry may also carry this scheduler's rules (``SCHEDULE_ENTRY_EXTRAS``:
``misfire_policy``, ``overlap_policy``, ``jitter``, windows...).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from beat.api import arguments_problem, define
from beat.errors import ConfigError, InvalidSchedule
from beat.models import ScheduleDefinition
from beat.store import definition_values
from beat.tables import Origin

#: Keys a ``beat_schedule`` entry may carry beyond Celery's own (our scheduling rules).
SCHEDULE_ENTRY_EXTRAS = frozenset(
    {
        "tz",
        "misfire_policy",
        "overlap_policy",
        "jitter",
        "start_at",
        "end_at",
        "max_runs",
        "max_attempts",
        "enabled",
    }
)

#: Attribute of a task object that holds the schedules given by :func:`periodic`.
TASK_SCHEDULES_ATTRIBUTE = "habeat_schedules"

TaskT = TypeVar("TaskT")


def periodic(
    *,
    cron: str | None = None,
    every: float | timedelta | None = None,
    name: str | None = None,
    tz: str | None = None,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Callable[[TaskT], TaskT]:
    """Schedule a Celery task from where it is defined::

        @periodic(cron="*/5 * * * *", tz="Europe/Berlin")
        @celery_app.task(base=IdempotentTask)
        def refresh_rates(): ...

    Put it above ``@app.task``. The schedule is named after the task unless
    ``name`` is given; stacking several ``@periodic`` needs distinct names.
    """

    def attach(task: TaskT) -> TaskT:
        entries: list[dict[str, Any]] = list(getattr(task, TASK_SCHEDULES_ATTRIBUTE, []))
        entries.append(
            dict(
                fields,
                cron=cron,
                every=every,
                name=name,
                tz=tz,
                args=list(args),
                kwargs=dict(kwargs or {}),
            )
        )
        setattr(task, TASK_SCHEDULES_ATTRIBUTE, entries)
        return task

    return attach


def collect(
    app: Any, *, default_tz: str, defaults: Mapping[str, Any] | None = None
) -> list[tuple[ScheduleDefinition, str]]:
    """Every code-defined schedule of ``app``, validated, with a hash of its definition.

    Raises :class:`ConfigError` naming the entry at fault: a schedule in code
    that cannot run is a bug to fix before deploying, not something to skip.
    """
    app_tz = default_tz if app.conf.timezone is None else str(app.conf.timezone)
    base = dict(defaults or {})
    found: dict[str, ScheduleDefinition] = {}
    for name, entry in (app.conf.beat_schedule or {}).items():
        definition = _from_beat_schedule(name, entry, app_tz, base)
        _add(found, definition, f"beat_schedule[{name!r}]")
    for task_name, task in sorted(app.tasks.items()):
        for entry in getattr(task, TASK_SCHEDULES_ATTRIBUTE, []):
            schedule_name = entry.get("name") or task_name
            fields = {
                key: value for key, value in entry.items() if key != "name" and value is not None
            }
            fields = {"default_tz": app_tz, **base, **fields}
            _add(found, _define(schedule_name, task_name, fields), f"@periodic on {task_name}")
    return [(definition, definition_hash(definition)) for definition in found.values()]


def task_warnings(app: Any, definitions: Iterable[tuple[ScheduleDefinition, str]]) -> list[str]:
    """One line for each code schedule whose task ``app`` does not know, or knows with a
    signature its arguments do not fit. Warned, not refused: beat publishes by name and
    need not import the workers' code, which may be right where this app is not (and
    refusing would stop beat, and every schedule, at a deploy)."""
    warnings = []
    for definition, _ in definitions:
        task = app.tasks.get(definition.task)
        if task is None:
            warnings.append(
                f"code schedule {definition.name}: task {definition.task!r} is not registered"
                f" with the Celery app '{app.main}': its runs fail unless the workers know it"
                " (check the name, or import its module: HABEAT_IMPORTS)"
            )
            continue
        problem = arguments_problem(task, definition)
        if problem is not None:
            warnings.append(
                f"code schedule {definition.name}: {problem}: its runs fail; fix its args/kwargs"
            )
    return warnings


def definition_hash(definition: ScheduleDefinition) -> str:
    """A stable hash of what code says: every column the definition sets, except the
    anchor of an interval (set when it is first synced) and the bookkeeping ones."""
    document = definition_values(definition)
    for column in ("anchor_at", "origin", "code_hash"):
        document.pop(column)
    encoded = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(encoded.encode()).hexdigest()


def _add(found: dict[str, ScheduleDefinition], definition: ScheduleDefinition, where: str) -> None:
    if definition.name in found:
        raise ConfigError(
            f"{where}: a code-defined schedule named '{definition.name}' exists already;"
            " give it a distinct name"
        )
    found[definition.name] = definition


def _from_beat_schedule(
    name: str, entry: Mapping[str, Any], app_tz: str, defaults: Mapping[str, Any]
) -> ScheduleDefinition:
    where = f"beat_schedule[{name!r}]"
    if "task" not in entry or "schedule" not in entry:
        raise ConfigError(f"{where} needs 'task' and 'schedule'")
    fields: dict[str, Any] = {
        **defaults,
        # As given: define refuses a string for args ("12" is not [1, 2]) or pairs for kwargs.
        "args": entry.get("args"),
        "kwargs": entry.get("kwargs"),
        "options": entry.get("options"),  # checked by define, whatever its type
        "default_tz": app_tz,  # tz only when the entry gives one: an interval has none
    }
    fields |= _timing_of(entry["schedule"], where)
    fields |= {key: entry[key] for key in SCHEDULE_ENTRY_EXTRAS if entry.get(key) is not None}
    unknown = sorted(
        set(entry)
        - {"task", "schedule", "args", "kwargs", "options", "relative"}
        - SCHEDULE_ENTRY_EXTRAS,
        key=str,  # keys of any type: an int key must not make sorting raise
    )
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown)):.200}")
    return _define(name, entry["task"], fields, where)


def _timing_of(schedule: Any, where: str) -> dict[str, Any]:
    """Translate a Celery schedule object into our timing fields."""
    from celery.schedules import crontab, solar
    from celery.schedules import schedule as interval_schedule

    if isinstance(schedule, str):
        return {"cron": schedule}
    if isinstance(schedule, int | float | timedelta):
        return {"every": schedule}
    if isinstance(schedule, crontab):
        # Read in the app's time zone (Celery's crontab has none of its own).
        return {"cron": _crontab_expression(schedule)}
    if isinstance(schedule, solar):
        raise ConfigError(f"{where}: solar schedules are not supported; use a cron expression")
    if isinstance(schedule, interval_schedule):
        return {"every": schedule.run_every}
    raise ConfigError(
        f"{where}: unsupported schedule {schedule!r};"
        " use crontab(), a number of seconds or a timedelta"
    )


def _crontab_expression(schedule: Any) -> str:
    parts = [
        schedule._orig_minute,
        schedule._orig_hour,
        schedule._orig_day_of_month,
        schedule._orig_month_of_year,
        schedule._orig_day_of_week,
    ]
    return " ".join(_crontab_field(part) for part in parts)


def _crontab_field(value: Any) -> str:
    if isinstance(value, int):
        return str(value)
    if isinstance(value, set | frozenset | list | tuple):
        return ",".join(str(item) for item in sorted(value))
    return str(value).replace(" ", "")


def _define(
    name: str, task: str, fields: dict[str, Any], where: str | None = None
) -> ScheduleDefinition:
    try:
        return define(name, task, origin=Origin.CODE, **fields)
    except InvalidSchedule as exc:
        raise ConfigError(f"{where or name}: {exc}") from exc

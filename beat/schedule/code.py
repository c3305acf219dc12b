"""Schedules defined in code: Celery's own ``beat_schedule`` setting and the
:func:`periodic` decorator on a task. Beat syncs them into PostgreSQL when it
starts (``Store.sync_code_schedules``).

``beat_schedule`` entries take the usual Celery forms (``crontab(...)``,
a number of seconds, a ``timedelta``, ``celery.schedules.schedule``) and also a
cron string. A ``crontab`` fires when Celery's would (every field must match,
both day fields included); ``solar`` and ``relative=True`` are refused, each in
one line saying what to use instead. An entry may also carry this scheduler's
rules (``SCHEDULE_ENTRY_EXTRAS``: ``misfire_policy``, ``overlap_policy``,
``jitter``, windows...).

A schedule may fire a workflow (``beat.schedule.workflow``): a ``beat_schedule`` entry
with a ``workflow`` key (a Celery canvas) instead of ``task``, or ``@periodic`` on a
plain function that returns the canvas (called once per sync, at beat start).
"""

from __future__ import annotations

import hashlib
import json
import os
import types
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, TypeVar, cast

from beat.errors import ConfigError, InvalidSchedule
from beat.models import Origin, ScheduleDefinition
from beat.schedule.define import arguments_problem, define, steps_problem
from beat.schedule.document import definition_values
from beat.schedule.timing import Cron, parse_zone
from beat.schedule.workflow import WORKFLOW_TASK

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
        "alert_after_failures",
        "pause_after_failures",
        "failure_states",
        "max_runtime",
        "revoke_after_max_runtime",
        "late_after",
        "missed_after",
        "channels",
    }
)

#: Attribute of a task object that holds the schedules given by :func:`periodic`.
TASK_SCHEDULES_ATTRIBUTE = "habeat_schedules"

#: Plain functions decorated with :func:`periodic`: each returns the canvas its schedules
#: fire (a workflow), in the order they were decorated.
_WORKFLOW_FUNCTIONS: list[Callable[[], Any]] = []

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

    On a plain function (not a task) that returns a Celery canvas, the schedule fires
    that workflow, named after the function's dotted path unless ``name`` is given::

        @periodic(cron="0 2 * * *")
        def nightly_etl():
            return chain(extract.s(), transform.s(), load.s())
    """

    def attach(task: TaskT) -> TaskT:
        # type(), not isinstance(): a task not yet made (Celery's promise) must stay lazy.
        if type(task) is types.FunctionType and not getattr(task, TASK_SCHEDULES_ATTRIBUTE, None):
            _WORKFLOW_FUNCTIONS.append(cast(Callable[[], Any], task))
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


def load_as_beat_does(app: Any) -> None:
    """Load ``app`` as ``celery beat`` does before it reads a schedule
    (``celery.apps.beat.Beat.init_loader``): the loader's worker start-up imports the
    task modules (``autodiscover_tasks()`` answers its ``import_modules`` signal), then
    ``finalize()`` sends ``on_after_finalize``, where apps call ``add_periodic_task``.
    Reading ``beat_schedule`` before that misses those entries. Each step runs once
    per process, so calling this again (in beat, after Celery did it) changes nothing."""
    app.loader.init_worker()
    app.finalize()


#: A sync that would remove more than this share of the stored code schedules needs
#: ``--prune``: code that lost most of them was more likely loaded wrong than edited.
PRUNE_SHARE = 0.5


def prune_refusal(stored: Iterable[str], found: Iterable[str]) -> str | None:
    """Why a sync that finds ``found`` must not remove the code schedules ``stored``
    without ``--prune`` (one line), or None when it removes few enough of them."""
    stored_names = set(stored)
    gone = stored_names - set(found)
    if not gone or len(gone) <= PRUNE_SHARE * len(stored_names):
        return None
    return (
        f"the code defines {len(stored_names) - len(gone)} of the {len(stored_names)} code"
        f" schedules stored, so this sync would remove {len(gone)} (e.g. {min(gone)!r}):"
        " if the code really dropped them, run it again with --prune; else check that the"
        " app's task modules import (autodiscover_tasks, imports, HABEAT_IMPORTS)"
    )


def collect(
    app: Any, *, default_tz: str, defaults: Mapping[str, Any] | None = None
) -> list[tuple[ScheduleDefinition, str]]:
    """Every code-defined schedule of ``app``, validated, with a hash of its definition.

    Raises :class:`ConfigError` naming the entry at fault: a schedule in code
    that cannot run is a bug to fix before deploying, not something to skip.
    """
    app_tz = app_zone(app, default_tz)
    base = dict(defaults or {})
    found: dict[str, ScheduleDefinition] = {}
    for name, entry in (app.conf.beat_schedule or {}).items():
        definition = _from_beat_schedule(name, entry, app_tz, base)
        _add(found, definition, f"beat_schedule[{name!r}]")
    for task_name, task in sorted(app.tasks.items()):
        for entry in getattr(task, TASK_SCHEDULES_ATTRIBUTE, []):
            fields = _periodic_fields(entry, app_tz, base)
            schedule_name = entry.get("name") or task_name
            _add(found, _define(schedule_name, task_name, fields), f"@periodic on {task_name}")
    for function in _WORKFLOW_FUNCTIONS:
        path = f"{function.__module__}.{function.__qualname__}"
        for entry in getattr(function, TASK_SCHEDULES_ATTRIBUTE, []):
            where = f"@periodic on {path}"
            fields = _periodic_fields(entry, app_tz, base) | {"workflow": _canvas(function, where)}
            _add(found, _define(entry.get("name") or path, "", fields, where), where)
    return [(definition, definition_hash(definition)) for definition in found.values()]


def _canvas(function: Callable[[], Any], where: str) -> Any:
    """What a workflow function returns; ConfigError naming it if it raises."""
    try:
        return function()
    except Exception as exc:
        raise ConfigError(f"{where}: building its workflow raised {exc!r:.200}") from exc


def _periodic_fields(
    entry: Mapping[str, Any], app_tz: str, base: Mapping[str, Any]
) -> dict[str, Any]:
    """The fields of one ``@periodic`` entry, over the defaults."""
    given = {key: value for key, value in entry.items() if key != "name" and value is not None}
    return {"default_tz": app_tz, **base, **given}


def beat_schedule_entries(
    app: Any, *, default_tz: str, defaults: Mapping[str, Any] | None = None
) -> dict[str, tuple[ScheduleDefinition, str] | ConfigError]:
    """Each entry of the app's ``beat_schedule`` by name: its definition with its hash
    (as :func:`collect` makes them, so a sync finds it unchanged), or why it cannot be
    one. Unlike :func:`collect`, one bad entry does not hide the others."""
    app_tz = app_zone(app, default_tz)
    base = dict(defaults or {})
    found: dict[str, tuple[ScheduleDefinition, str] | ConfigError] = {}
    for name, entry in (app.conf.beat_schedule or {}).items():
        try:
            definition = _from_beat_schedule(name, entry, app_tz, base)
        except ConfigError as exc:
            found[name] = exc
        else:
            found[name] = (definition, definition_hash(definition))
    return found


def app_zone(app: Any, default_tz: str) -> str:
    """The zone Celery reads the app's crontabs in (``Celery.timezone``): its
    ``timezone``, else the host's local zone when ``enable_utc`` is off, else
    ``default_tz`` (UTC unless habeat_default_timezone says otherwise)."""
    if app.conf.timezone:
        return str(app.conf.timezone)
    if not app.conf.enable_utc:
        return host_zone()
    return default_tz


#: Where the zone database keeps a zone's file: ``<dir>/Europe/Berlin``.
_ZONEINFO_DIR = "zoneinfo/"
#: The host's zone when ``TZ`` is unset: a link into the zone database.
_LOCALTIME = "/etc/localtime"


def host_zone() -> str:
    """The IANA name of the zone the C library calls local (``TZ``, else
    ``/etc/localtime``), which is the one Celery's ``timezone.local`` follows.

    A schedule keeps a zone's name, so a zone without one (``TZ=CET-1CEST``) is refused
    with the setting that fixes it."""
    configured = os.environ.get("TZ", "").lstrip(":")
    if not configured:
        if not os.path.exists(_LOCALTIME):
            return "UTC"  # what the C library uses without either
        configured = os.path.realpath(_LOCALTIME)
    name = configured.rpartition(_ZONEINFO_DIR)[2] if _ZONEINFO_DIR in configured else configured
    try:
        parse_zone(name)
    except InvalidSchedule:
        raise ConfigError(
            f"the app reads its schedules in the host's local time (enable_utc is off and no"
            f" timezone is set), whose zone {configured!r} has no IANA name: set the app's"
            " timezone, e.g. timezone = 'Europe/Berlin'"
        ) from None
    return name


def task_warnings(app: Any, definitions: Iterable[tuple[ScheduleDefinition, str]]) -> list[str]:
    """One line for each code schedule whose task ``app`` does not know, or knows with a
    signature its arguments do not fit. Warned, not refused: beat publishes by name and
    need not import the workers' code, which may be right where this app is not (and
    refusing would stop beat, and every schedule, at a deploy)."""
    warnings = []
    for definition, _ in definitions:
        if definition.task == WORKFLOW_TASK:
            problem = steps_problem(app.tasks, definition)
            if problem is not None:
                warnings.append(f"code schedule {definition.name}: {problem}: its runs fail")
            continue
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


#: Columns added after code schedules were first hashed: unset (None, False), they are
#: left out of the hash.
_LATER_COLUMNS = (
    "alert_after_failures",
    "pause_after_failures",
    "failure_states",
    "max_runtime_seconds",
    "revoke_after_max_runtime",
    "late_after_seconds",
    "missed_after_seconds",
    "channels",
)


def definition_hash(definition: ScheduleDefinition) -> str:
    """A stable hash of what code says: every column the definition sets, except the
    anchor of an interval (set when it is first synced) and the bookkeeping ones."""
    document = definition_values(definition)
    for column in ("anchor_at", "origin", "code_hash"):
        document.pop(column)
    if not document["cron_both_days"]:
        # A column added later: the schedules it does not concern keep their hash, so
        # upgrading does not count them as changed.
        document.pop("cron_both_days")
    for column in _LATER_COLUMNS:
        if not document[column]:
            document.pop(column)  # added later too: the schedules without keep their hash
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
    if "schedule" not in entry or ("task" in entry) == ("workflow" in entry):
        raise ConfigError(f"{where} needs 'schedule' and one of 'task' or 'workflow'")
    fields: dict[str, Any] = {
        **defaults,
        # As given: define refuses a string for args ("12" is not [1, 2]) or pairs for kwargs.
        "args": entry.get("args"),
        "kwargs": entry.get("kwargs"),
        "options": entry.get("options"),  # checked by define, whatever its type
        "default_tz": app_tz,  # tz only when the entry gives one: an interval has none
    }
    fields |= timing_of(entry["schedule"], bool(entry.get("relative")), where)
    fields |= {key: entry[key] for key in SCHEDULE_ENTRY_EXTRAS if entry.get(key) is not None}
    if "workflow" in entry:
        fields["workflow"] = entry["workflow"]
    unknown = sorted(
        set(entry)
        - {"task", "workflow", "schedule", "args", "kwargs", "options", "relative"}
        - SCHEDULE_ENTRY_EXTRAS,
        key=str,  # keys of any type: an int key must not make sorting raise
    )
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown)):.200}")
    return _define(name, entry.get("task", ""), fields, where)


def timing_of(schedule: Any, relative: bool, where: str) -> dict[str, Any]:
    """Translate a Celery schedule into our timing fields, or refuse it in one line
    that says what to use instead: a schedule that would fire at other times than
    under ``celery beat`` must not start."""
    from celery.schedules import crontab, solar
    from celery.schedules import schedule as interval_schedule

    if isinstance(schedule, str):
        return {"cron": schedule}
    if isinstance(schedule, solar):
        raise ConfigError(
            f"{where}: solar({schedule.event!r}, {schedule.lat}, {schedule.lon}) is not"
            " supported (beat computes no sunrise or sunset times); use crontab() at a fixed"
            " local time, e.g. crontab(hour=7, minute=0), with 'tz' set to the place's zone"
        )
    if isinstance(schedule, crontab):
        _refuse_own_rules(schedule, crontab, where)
        return {"cron": crontab_trigger(schedule, where)}
    if isinstance(schedule, interval_schedule):
        _refuse_own_rules(schedule, interval_schedule, where)
        relative, schedule = schedule.relative, schedule.run_every
    if isinstance(schedule, int | float | timedelta):
        # Celery applies an entry's 'relative' to numbers and timedeltas only.
        if relative:
            raise _relative_refusal(schedule, where)
        return {"every": schedule}
    kind = type(schedule)
    raise ConfigError(
        f"{where}: unsupported schedule of type {kind.__module__}.{kind.__qualname__};"
        " use crontab(), schedule(run_every), a number of seconds, a timedelta or a cron string"
    )


#: What a Celery schedule's subclass may not change: when it is due.
_TIMING_METHODS = ("is_due", "remaining_estimate", "remaining_delta")


def _refuse_own_rules(schedule: Any, base: type, where: str) -> None:
    """A subclass that decides differently when it is due (django-celery-beat's
    TzAwareCrontab has its own zone) cannot be read from its fields."""
    kind = type(schedule)
    changed = [
        name
        for name in _TIMING_METHODS
        if getattr(kind, name, None) is not getattr(base, name, None)
    ]
    if changed:
        raise ConfigError(
            f"{where}: {kind.__qualname__} changes how {base.__name__}() decides when it is due"
            f" ({', '.join(changed)}), which beat cannot follow; use celery.schedules."
            f"{base.__name__} itself, with 'tz' for another zone"
        )


#: Celery rounds the next run of a relative interval (last run + interval) down to the
#: midnight, hour or minute, by the interval's size: (seconds from, unit, the crontab).
_RELATIVE_ROUNDING = (
    (86400, "midnight", "crontab(minute=0, hour=0)"),
    (3600, "hour", "crontab(minute=0)"),
    (60, "minute", "crontab(minute='*/5')"),
)


def _relative_refusal(run_every: float | timedelta, where: str) -> ConfigError:
    seconds = run_every.total_seconds() if isinstance(run_every, timedelta) else run_every
    for limit, unit, example in _RELATIVE_ROUNDING:
        if seconds >= limit:
            return ConfigError(
                f"{where}: relative=True is not supported (Celery rounds each run down to the"
                f" {unit}, counting from when beat last ran); use crontab() for runs on the"
                f" clock, e.g. {example}, or remove relative=True"
            )
    return ConfigError(
        f"{where}: relative=True is not supported; below a minute Celery rounds only to the"
        " second: remove relative=True"
    )


#: Celery's crontab attributes in cron's field order, with each field's values.
_CRONTAB_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month_of_year", 1, 12),
    ("day_of_week", 0, 6),  # 0 is Sunday, as in cron
)


def crontab_trigger(schedule: Any, where: str) -> Cron:
    """The trigger that fires when Celery's ``crontab`` ``schedule`` does, read in the
    same zone (the app's, unless the entry sets 'tz').

    Built from the sets Celery expands each field to, whatever the field was
    written with (a string, a number, a set, a range()), so both read the same
    values. Celery needs a day to match every field: ``both_days``.
    """
    fields = []
    for name, low, high in _CRONTAB_FIELDS:
        values = getattr(schedule, name)
        if not values or not all(type(value) is int for value in values):
            raise ConfigError(
                f"{where}: crontab {name}={values!r} must hold whole numbers from {low} to"
                f" {high}; give at least one"
            )
        fields.append(_cron_field(sorted(values), low, high))
    return Cron(expression=" ".join(fields), both_days=True)


def _cron_field(values: list[int], low: int, high: int) -> str:
    """Sorted distinct ``values`` in a familiar spelling, for people to read: ``*``,
    ``*/n``, ``a-b/n``, or a list of values and ranges."""
    if values == list(range(low, high + 1)):
        return "*"
    step = values[1] - values[0] if len(values) > 2 else 0
    if step > 1 and values == list(range(values[0], values[-1] + 1, step)):
        whole_field = values[0] == low and values[-1] + step > high
        return f"*/{step}" if whole_field else f"{values[0]}-{values[-1]}/{step}"
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(
        f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)) for run in runs
    )


def _define(
    name: str, task: str, fields: dict[str, Any], where: str | None = None
) -> ScheduleDefinition:
    try:
        return define(name, task, origin=Origin.CODE, **fields)
    except InvalidSchedule as exc:
        raise ConfigError(f"{where or name}: {exc}") from exc
